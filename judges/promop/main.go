// promop runs the Prometheus Operator's own scrape-configuration generator on the PodMonitors
// Forge renders, so tests judge them by what the operator does with them, not by reading them.
//
//	promop scrape-config [-prometheus-version 2.42.0] [-override-honor-labels] [-enforced-namespace-label L] < manifests.json
//	promop pod-targets < pod.json        (see podtargets.go)
//
// scrape-config: stdin: a JSON manifest or a JSON list of manifests; every `kind: PodMonitor` is decoded strictly
// (unknown fields are errors, as the API server's structural schema would prune or reject them)
// into the operator's monitoringv1.PodMonitor, the other kinds are ignored.
// stdout: the Prometheus server configuration (YAML) that the operator's
// prometheus.ConfigGenerator.GenerateServerConfiguration writes for a Prometheus that selects
// them, exactly as the operator's reconcile loop calls it (pkg/prometheus/server/operator.go).
// Module version: judges/promop/go.mod, pinned to PROMETHEUS_OPERATOR_VERSION of
// scripts/cluster/versions.env.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus-operator/prometheus-operator/pkg/assets"
	"github.com/prometheus-operator/prometheus-operator/pkg/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: promop scrape-config [flags] < manifests.json | promop pod-targets < pod.json")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "scrape-config":
		fs := flag.NewFlagSet("scrape-config", flag.ExitOnError)
		version := fs.String("prometheus-version", "", "spec.version: the Prometheus the config is for (default: the operator's default)")
		override := fs.Bool("override-honor-labels", false, "spec.overrideHonorLabels")
		enforced := fs.String("enforced-namespace-label", "", "spec.enforcedNamespaceLabel")
		scrape := fs.String("scrape-interval", "30s", "spec.scrapeInterval (the CRD's default)")
		eval := fs.String("evaluation-interval", "30s", "spec.evaluationInterval (the CRD's default)")
		_ = fs.Parse(os.Args[2:])
		err = scrapeConfig(os.Stdin, os.Stdout, *version, *override, *enforced, *scrape, *eval)
	case "pod-targets":
		err = podTargets(os.Stdin, os.Stdout)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "promop:", err)
		os.Exit(1)
	}
}

// strictJSON decodes like the API server's strict field validation: an unknown field is an error.
func strictJSON(doc []byte, into any) error {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	return dec.Decode(into)
}

func scrapeConfig(in io.Reader, out io.Writer, version string, override bool, enforced, scrape, eval string) error {
	raw, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	var docs []json.RawMessage
	if trimmed := bytes.TrimSpace(raw); len(trimmed) > 0 && trimmed[0] == '[' {
		if err := json.Unmarshal(trimmed, &docs); err != nil {
			return fmt.Errorf("stdin: %w", err)
		}
	} else {
		docs = []json.RawMessage{raw}
	}
	pMons := map[string]*monitoringv1.PodMonitor{}
	for i, doc := range docs {
		var head metav1.TypeMeta
		if err := json.Unmarshal(doc, &head); err != nil {
			return fmt.Errorf("manifest %d: %w", i, err)
		}
		if head.Kind != monitoringv1.PodMonitorsKind || head.APIVersion != monitoringv1.SchemeGroupVersion.String() {
			continue
		}
		pm := &monitoringv1.PodMonitor{}
		if err := strictJSON(doc, pm); err != nil {
			return fmt.Errorf("manifest %d (PodMonitor): %w", i, err)
		}
		pMons[pm.Namespace+"/"+pm.Name] = pm
	}
	if len(pMons) == 0 {
		return fmt.Errorf("no %s %s in the input", monitoringv1.SchemeGroupVersion, monitoringv1.PodMonitorsKind)
	}

	p := &monitoringv1.Prometheus{
		TypeMeta:   metav1.TypeMeta{APIVersion: monitoringv1.SchemeGroupVersion.String(), Kind: monitoringv1.PrometheusesKind},
		ObjectMeta: metav1.ObjectMeta{Name: "k8s", Namespace: "monitoring"},
		Spec: monitoringv1.PrometheusSpec{
			CommonPrometheusFields: monitoringv1.CommonPrometheusFields{
				PodMonitorSelector:          &metav1.LabelSelector{},
				PodMonitorNamespaceSelector: &metav1.LabelSelector{},
				ScrapeInterval:              monitoringv1.Duration(scrape),
				Version:                     version,
				OverrideHonorLabels:         override,
				EnforcedNamespaceLabel:      enforced,
			},
			EvaluationInterval: monitoringv1.Duration(eval),
		},
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cg, err := prometheus.NewConfigGenerator(logger, p)
	if err != nil {
		return err
	}
	cfg, err := cg.GenerateServerConfiguration(p, nil, pMons, nil, nil, assets.NewStoreBuilder(nil, nil), nil, nil, nil, nil)
	if err != nil {
		return err
	}
	_, err = out.Write(cfg)
	return err
}
