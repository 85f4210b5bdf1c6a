package main

import (
	"encoding/json"
	"strings"

	"github.com/Masterminds/semver/v3"
)

// semverInput asks which tags each range admits, as Flux's source-controller picks a
// GitRepository's `ref.semver` tag: a tag is a version when fluxcd/pkg/version.ParseVersion
// takes it (semver.StrictNewVersion after an optional leading "v"), and it is admitted when
// semver.NewConstraint(range).Check(version) holds.
type semverInput struct {
	Ranges []string `json:"ranges"`
	Tags   []string `json:"tags"`
}

// semverVerdict is one range's answer: the error NewConstraint gave, or the admitted tags (in
// the order given).
type semverVerdict struct {
	Range  string   `json:"range"`
	Error  string   `json:"error,omitempty"`
	Admits []string `json:"admits"`
}

// parseTagVersion is fluxcd/pkg/version.ParseVersion, copied verbatim (Flux v2's pkg/version).
func parseTagVersion(v string) (*semver.Version, error) {
	vLessV := strings.TrimPrefix(v, "v")
	if _, err := semver.StrictNewVersion(vLessV); err != nil {
		return nil, err
	}
	return semver.NewVersion(v)
}

func judgeSemver(in []byte) any {
	var req semverInput
	if err := json.Unmarshal(in, &req); err != nil {
		fail("semver: %v", err)
	}
	versions := map[string]*semver.Version{}
	for _, tag := range req.Tags {
		if v, err := parseTagVersion(tag); err == nil {
			versions[tag] = v
		}
	}
	out := make([]semverVerdict, 0, len(req.Ranges))
	for _, r := range req.Ranges {
		verdict := semverVerdict{Range: r, Admits: []string{}}
		c, err := semver.NewConstraint(r)
		if err != nil {
			verdict.Error = err.Error()
		} else {
			for _, tag := range req.Tags {
				if v, ok := versions[tag]; ok && c.Check(v) {
					verdict.Admits = append(verdict.Admits, tag)
				}
			}
		}
		out = append(out, verdict)
	}
	return out
}
