// forge-judge asks upstream code whether a rendered object is right.
//
//	forge-judge argo-validate        Workflow (or a JSON array of them) -> {ok, errors}
//	forge-judge argo-expr            {mode, expression, scope}          -> {value} | {error}
//	forge-judge pytorchjob-validate  PyTorchJob (or an array)           -> {ok, errors, warnings}
//	forge-judge pod-security         objects (or {level, version, …})    -> {ok, errors, pods} each
//	                                 (the Pod Security admission's evaluator; see podsecurity.go)
//	forge-judge semver               {ranges, tags}                     -> [{range, error, admits}]
//	                                 (the tags a Flux GitRepository's ref.semver admits; semver.go)
//
// Each subcommand reads one JSON document on stdin and writes one JSON document on stdout.
// A verdict (valid or not) exits 0; exit 1 means the judge itself could not run (bad input).
// Nothing here re-implements a rule: it decodes the way the API server does and calls the
// upstream function; where upstream keeps the function unexported it is copied verbatim
// (see expr.go) and pinned by tests/judges.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	kjson "sigs.k8s.io/json"
)

// verdict is the answer for one object.
type verdict struct {
	OK       bool     `json:"ok"`
	Errors   []string `json:"errors"`
	Warnings []string `json:"warnings,omitempty"`
}

func main() {
	if len(os.Args) != 2 {
		fail("usage: forge-judge argo-validate|argo-expr|pytorchjob-validate|pod-security|semver < input.json")
	}
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("reading stdin: %v", err)
	}
	var out any
	switch os.Args[1] {
	case "argo-validate":
		out = eachObject(in, validateWorkflow)
	case "pytorchjob-validate":
		out = eachObject(in, validatePyTorchJob)
	case "argo-expr":
		out = evalExpr(in)
	case "pod-security":
		out = podSecurity(in)
		runCleanups()
	case "semver":
		out = judgeSemver(in)
	default:
		fail("unknown subcommand %q", os.Args[1])
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		fail("writing stdout: %v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "forge-judge: "+format+"\n", args...)
	os.Exit(1)
}

// eachObject judges one object, or each element of a JSON array (one process for a whole suite).
func eachObject(in []byte, judge func([]byte) verdict) any {
	var many []json.RawMessage
	if err := json.Unmarshal(in, &many); err == nil {
		out := make([]verdict, 0, len(many))
		for _, raw := range many {
			out = append(out, judge(raw))
		}
		return out
	}
	return judge(in)
}

// strictDecode decodes like the API server with fieldValidation=Strict (sigs.k8s.io/json:
// case-sensitive, unknown and duplicate fields are errors). A bad quantity or a wrong type is a
// decode error. Returns the messages; none means the object decoded cleanly.
func strictDecode(raw []byte, into any) []string {
	strictErrs, err := kjson.UnmarshalStrict(raw, into)
	if err != nil {
		return []string{"decode: " + err.Error()}
	}
	var msgs []string
	for _, e := range strictErrs {
		msgs = append(msgs, "strict decoding: "+e.Error())
	}
	return msgs
}

func newVerdict(errs, warnings []string) verdict {
	if errs == nil {
		errs = []string{}
	}
	return verdict{OK: len(errs) == 0, Errors: errs, Warnings: warnings}
}
