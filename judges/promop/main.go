// promop runs the Prometheus Operator's own code on the objects Forge renders, so tests judge them
// by what the operator does with them, not by reading them.
//
//	promop config [-prometheus-version 2.42.0] [-override-honor-labels] [-enforced-namespace-label L] < manifests.json
//	promop pod-targets < pod.json        (see podtargets.go)
//
// config: stdin is a JSON manifest or a JSON list of manifests. Every monitoring.coreos.com/v1
// PodMonitor and PrometheusRule is decoded strictly (an unknown field is an error, as the API
// server's strict field validation makes it) into the operator's own types; other kinds are
// ignored. stdout is JSON {"config": <prometheus.yaml>, "ruleFiles": {<file>: <content>}}:
//   - config: what prometheus.ConfigGenerator.GenerateServerConfiguration writes for a Prometheus
//     that selects them all, as the operator's reconcile loop calls it
//     (pkg/prometheus/server/operator.go), rule_files pointing at one rule ConfigMap;
//   - ruleFiles: the rule files that operator.PrometheusRuleSelector.Select makes of the
//     PrometheusRules (pkg/prometheus/server/rules.go): sanitized for the Prometheus version,
//     validated with Prometheus's rule parser, namespace label enforced when asked. A rule the
//     operator would reject is an error here.
//
// Module versions: judges/promop/go.mod, pinned to PROMETHEUS_OPERATOR_VERSION of
// scripts/cluster/versions.env (judges/promop/build.sh checks it).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus-operator/prometheus-operator/pkg/assets"
	monitoringfake "github.com/prometheus-operator/prometheus-operator/pkg/client/versioned/fake"
	"github.com/prometheus-operator/prometheus-operator/pkg/informers"
	"github.com/prometheus-operator/prometheus-operator/pkg/namespacelabeler"
	"github.com/prometheus-operator/prometheus-operator/pkg/operator"
	"github.com/prometheus-operator/prometheus-operator/pkg/prometheus"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// ruleConfigMap is the name the operator gives the first rule ConfigMap of Prometheus "k8s".
const ruleConfigMap = "prometheus-k8s-rulefiles-0"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: promop config [flags] < manifests.json | promop pod-targets < pod.json")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "config":
		fs := flag.NewFlagSet("config", flag.ExitOnError)
		opts := options{}
		fs.StringVar(&opts.version, "prometheus-version", operator.DefaultPrometheusVersion, "spec.version: the Prometheus the config is for")
		fs.BoolVar(&opts.overrideHonorLabels, "override-honor-labels", false, "spec.overrideHonorLabels")
		fs.StringVar(&opts.enforcedNamespaceLabel, "enforced-namespace-label", "", "spec.enforcedNamespaceLabel")
		fs.StringVar(&opts.scrapeInterval, "scrape-interval", "30s", "spec.scrapeInterval (the CRD's default)")
		fs.StringVar(&opts.evaluationInterval, "evaluation-interval", "30s", "spec.evaluationInterval (the CRD's default)")
		_ = fs.Parse(os.Args[2:])
		err = serverConfig(os.Stdin, os.Stdout, opts)
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

type options struct {
	version, enforcedNamespaceLabel, scrapeInterval, evaluationInterval string
	overrideHonorLabels                                                 bool
}

// strictJSON decodes like the API server's strict field validation: an unknown field is an error.
func strictJSON(doc []byte, into any) error {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	return dec.Decode(into)
}

func serverConfig(in io.Reader, out io.Writer, opts options) error {
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
	var rules []runtime.Object
	ruleNamespaces := map[string]bool{}
	for i, doc := range docs {
		var head metav1.TypeMeta
		if err := json.Unmarshal(doc, &head); err != nil {
			return fmt.Errorf("manifest %d: %w", i, err)
		}
		if head.APIVersion != monitoringv1.SchemeGroupVersion.String() {
			continue
		}
		switch head.Kind {
		case monitoringv1.PodMonitorsKind:
			pm := &monitoringv1.PodMonitor{}
			if err := strictJSON(doc, pm); err != nil {
				return fmt.Errorf("manifest %d (PodMonitor): %w", i, err)
			}
			pMons[pm.Namespace+"/"+pm.Name] = pm
		case monitoringv1.PrometheusRuleKind:
			pr := &monitoringv1.PrometheusRule{}
			if err := strictJSON(doc, pr); err != nil {
				return fmt.Errorf("manifest %d (PrometheusRule): %w", i, err)
			}
			pr.UID = types.UID("uid-" + pr.Namespace + "-" + pr.Name) // the API server sets one; the file name carries it
			rules = append(rules, pr)
			ruleNamespaces[pr.Namespace] = true
		}
	}

	p := &monitoringv1.Prometheus{
		TypeMeta:   metav1.TypeMeta{APIVersion: monitoringv1.SchemeGroupVersion.String(), Kind: monitoringv1.PrometheusesKind},
		ObjectMeta: metav1.ObjectMeta{Name: "k8s", Namespace: "monitoring"},
		Spec: monitoringv1.PrometheusSpec{
			CommonPrometheusFields: monitoringv1.CommonPrometheusFields{
				PodMonitorSelector:          &metav1.LabelSelector{},
				PodMonitorNamespaceSelector: &metav1.LabelSelector{},
				ScrapeInterval:              monitoringv1.Duration(opts.scrapeInterval),
				Version:                     opts.version,
				OverrideHonorLabels:         opts.overrideHonorLabels,
				EnforcedNamespaceLabel:      opts.enforcedNamespaceLabel,
			},
			EvaluationInterval:    monitoringv1.Duration(opts.evaluationInterval),
			RuleSelector:          &metav1.LabelSelector{},
			RuleNamespaceSelector: &metav1.LabelSelector{},
		},
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	ruleFiles, err := selectRules(p, rules, ruleNamespaces, logger)
	if err != nil {
		return err
	}
	var ruleConfigMaps []string
	if len(ruleFiles) > 0 {
		ruleConfigMaps = []string{ruleConfigMap}
	}

	cg, err := prometheus.NewConfigGenerator(logger, p)
	if err != nil {
		return err
	}
	cfg, err := cg.GenerateServerConfiguration(p, nil, pMons, nil, nil, assets.NewStoreBuilder(nil, nil), nil, nil, nil, ruleConfigMaps)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(map[string]any{"config": string(cfg), "ruleFiles": ruleFiles})
}

// selectRules runs the operator's PrometheusRule selection, with the arguments
// pkg/prometheus/server/rules.go gives it, over informers of a cluster that holds the rules.
func selectRules(p *monitoringv1.Prometheus, rules []runtime.Object, namespaces map[string]bool, logger *slog.Logger) (map[string]string, error) {
	if len(rules) == 0 {
		return map[string]string{}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := monitoringfake.NewSimpleClientset(rules...)
	factories := informers.NewMonitoringInformerFactories(map[string]struct{}{corev1.NamespaceAll: {}}, map[string]struct{}{}, client, 0, nil)
	ruleInfs, err := informers.NewInformersForResource(factories, monitoringv1.SchemeGroupVersion.WithResource(monitoringv1.PrometheusRuleName))
	if err != nil {
		return nil, err
	}
	ruleInfs.Start(ctx.Done())
	for !ruleInfs.HasSynced() {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("the PrometheusRule informer did not sync in 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	selector, err := operator.NewPrometheusRuleSelector(
		operator.PrometheusFormat,
		p.Spec.Version,
		p.Spec.RuleSelector,
		namespacelabeler.New(p.Spec.EnforcedNamespaceLabel, p.Spec.ExcludedFromEnforcement, true),
		ruleInfs,
		operator.NewFakeRecorder(len(rules)+1, p),
		logger,
		parser.Options{},
	)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(namespaces))
	for ns := range namespaces {
		names = append(names, ns)
	}
	sort.Strings(names)
	selection, err := selector.Select(names)
	if err != nil {
		return nil, err
	}
	if selection.SelectedLen() != len(rules) || selection.RejectedLen() != 0 {
		return nil, fmt.Errorf("the operator selected %d of %d PrometheusRules and rejected %d (its log above says why)",
			selection.SelectedLen(), len(rules), selection.RejectedLen())
	}
	return selection.RuleFiles(), nil
}
