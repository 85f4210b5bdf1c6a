// seldon-judge runs Seldon Core v1's own operator code (github.com/seldonio/seldon-core/operator,
// v1.17.1, the last Apache-2.0 release) on the SeldonDeployments Forge renders, so tests judge them
// by what the webhook and the controller do with them, not by reading them.
//
//	seldon-judge validate < sdep.json                  SeldonDeployment (or a JSON array) -> {ok, errors}
//	seldon-judge render [-ingress I] < sdep.json       SeldonDeployment (or a JSON array) -> {ok, errors, objects}
//
// validate: a strict decode into the operator's v1 type (an unknown or duplicate field, a bad
// quantity or a wrong type is an error, as the API server's strict field validation makes it), then
// the operator's validating webhook for a create (v1 SeldonDeployment.ValidateCreate, i.e.
// SeldonDeploymentSpec.ValidateSeldonDeployment, the only admission webhook v1.17.1 registers for
// v1), then the same validation again after SeldonDeployment.Default(), the defaulting the controller
// runs at the start of every reconcile (errors found only then say "after Default():").
//
// render: validate, then one pass of the controller's own Reconcile
// (controllers.SeldonDeploymentReconciler: Default, createComponents, createServices, createHpas,
// createPdbs, createDeployments) against controller-runtime's fake client holding the object and
// its namespace; stdout lists what the controller created there: Deployments, Services,
// HorizontalPodAutoscalers, PodDisruptionBudgets (and with -ingress istio, VirtualServices and
// DestinationRules), sorted by kind and name.
//
// -ingress says how the operator is installed: none (Istio and Ambassador off, the code's default;
// the install manifest turns Ambassador v1 on. Nothing then routes by `traffic`: Seldon v1 splits
// traffic only through Istio or Ambassador), istio (ISTIO_ENABLED=true:
// the controller writes a VirtualService with one weighted route per predictor, once the
// Deployments are available, so render marks them available and reconciles a second time, as the
// controller would on the Deployments' status change) or ambassador (AMBASSADOR_ENABLED=true,
// AMBASSADOR_VERSION=v1: weighted Mappings as the predictor Services' getambassador.io/config
// annotation).
//
// The operator is configured by its environment (PREDICTIVE_UNIT_*_PORT, EXECUTOR_*, ISTIO_ENABLED,
// AMBASSADOR_ENABLED, ...), most of it read when the process starts. seldon-judge runs it with the
// environment of the operator's own install manifest (operator/config/manager/manager.yaml, see
// installEnv), less the ingress switches that -ingress sets: it re-executes itself once with
// those variables added (a variable already set is kept). So the first model port is 9000 (http)
// and 9500 (grpc), the metrics port 6000 is named "metrics", and the executor is
// seldonio/seldon-core-executor:1.17.1 on port 8000. The Python client (reconciler/targets/local/upstream.py)
// passes none of its own Seldon variables.
//
// Exit 0: a verdict (valid or not). Exit 1: the judge itself could not run (bad input).
// The operator source comes from ../shared/vendor-src (see go.mod and build.sh): the Go module
// proxy refuses github.com/seldonio/seldon-core/operator.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"syscall"

	"github.com/go-logr/logr"
	machinelearningv1 "github.com/seldonio/seldon-core/operator/apis/machinelearning.seldon.io/v1"
	"github.com/seldonio/seldon-core/operator/controllers"
	istio "istio.io/client-go/pkg/apis/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	kjson "sigs.k8s.io/json"
)

type verdict struct {
	OK     bool     `json:"ok"`
	Errors []string `json:"errors"`
	// Objects: what the controller created (render only).
	Objects []map[string]any `json:"objects,omitempty"`
}

// installEnv: the manager container's environment in the operator's own install manifest
// (operator/config/manager/manager.yaml of v1.17.1), its non-empty values, less AMBASSADOR_* and
// ISTIO_ENABLED (-ingress) and the manager's own settings (leader election, log level, webhook).
var installEnv = [][2]string{
	{"POD_NAMESPACE", "seldon-system"},
	{"PREDICTIVE_UNIT_HTTP_SERVICE_PORT", "9000"},
	{"PREDICTIVE_UNIT_GRPC_SERVICE_PORT", "9500"},
	{"PREDICTIVE_UNIT_METRICS_PORT_NAME", "metrics"},
	{"KEDA_ENABLED", "false"},
	{"ISTIO_GATEWAY", "istio-system/seldon-gateway"},
	{"USE_EXECUTOR", "true"},
	{"EXECUTOR_CONTAINER_IMAGE_AND_VERSION", "seldonio/seldon-core-executor:1.17.1"},
	{"EXECUTOR_CONTAINER_IMAGE_PULL_POLICY", "IfNotPresent"},
	{"EXECUTOR_PROMETHEUS_PATH", "/prometheus"},
	{"EXECUTOR_SERVER_PORT", "8000"},
	{"EXECUTOR_CONTAINER_USER", "8888"},
	{"EXECUTOR_CONTAINER_SERVICE_ACCOUNT_NAME", "default"},
	{"EXECUTOR_SERVER_METRICS_PORT_NAME", "metrics"},
	{"EXECUTOR_REQUEST_LOGGER_DEFAULT_ENDPOINT", "http://default-broker"},
	{"EXECUTOR_REQUEST_LOGGER_WORK_QUEUE_SIZE", "10000"},
	{"EXECUTOR_REQUEST_LOGGER_WRITE_TIMEOUT_MS", "2000"},
	{"EXECUTOR_DEFAULT_CPU_REQUEST", "0.5"},
	{"EXECUTOR_DEFAULT_MEMORY_REQUEST", "512Mi"},
	{"EXECUTOR_DEFAULT_CPU_LIMIT", "0.5"},
	{"EXECUTOR_DEFAULT_MEMORY_LIMIT", "512Mi"},
	{"DEPLOYMENT_NAME_AS_PREFIX", "false"},
	{"EXECUTOR_FULL_HEALTH_CHECKS", "false"},
}

const reexecMarker = "SELDON_JUDGE_INSTALL_ENV"

// withInstallEnv re-executes this binary with installEnv added, once: the operator's packages
// read most of their settings while they initialise, before main runs.
func withInstallEnv() {
	if os.Getenv(reexecMarker) != "" {
		return
	}
	env := os.Environ()
	for _, kv := range installEnv {
		if _, set := os.LookupEnv(kv[0]); !set {
			env = append(env, kv[0]+"="+kv[1])
		}
	}
	env = append(env, reexecMarker+"=1")
	exe, err := os.Executable()
	if err != nil {
		fail("finding my own executable: %v", err)
	}
	fail("re-executing with the operator's environment: %v", syscall.Exec(exe, os.Args, env))
}

func main() {
	withInstallEnv()
	if len(os.Args) < 2 {
		fail("usage: seldon-judge validate|render [-ingress none|istio|ambassador] < seldondeployment.json")
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	ingress := fs.String("ingress", "none", "render: none, istio or ambassador (how the operator is installed)")
	_ = fs.Parse(os.Args[2:])
	switch *ingress {
	case "none":
	case "istio":
		os.Setenv("ISTIO_ENABLED", "true")
	case "ambassador":
		os.Setenv("AMBASSADOR_ENABLED", "true")
		os.Setenv("AMBASSADOR_VERSION", "v1")
	default:
		fail("unknown -ingress %q (none, istio, ambassador)", *ingress)
	}
	logf.SetLogger(logr.Discard()) // the operator logs every step; stdout is the verdict only
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("reading stdin: %v", err)
	}
	var judge func([]byte) verdict
	switch os.Args[1] {
	case "validate":
		judge = func(raw []byte) verdict { _, v := validate(raw); return v }
	case "render":
		judge = func(raw []byte) verdict { return render(raw, *ingress == "istio") }
	default:
		fail("unknown subcommand %q", os.Args[1])
	}
	var out any
	var many []json.RawMessage
	if err := json.Unmarshal(in, &many); err == nil {
		all := make([]verdict, 0, len(many))
		for _, raw := range many {
			all = append(all, judge(raw))
		}
		out = all
	} else {
		out = judge(in)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		fail("writing stdout: %v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "seldon-judge: "+format+"\n", args...)
	os.Exit(1)
}

func newVerdict(errs []string) verdict {
	if errs == nil {
		errs = []string{}
	}
	return verdict{OK: len(errs) == 0, Errors: errs}
}

// fieldErrors lists an admission error one field error per line, as kubectl shows them.
func fieldErrors(err error) []string {
	if err == nil {
		return nil
	}
	if se, ok := err.(*apierrors.StatusError); ok && se.ErrStatus.Details != nil && len(se.ErrStatus.Details.Causes) > 0 {
		var out []string
		for _, c := range se.ErrStatus.Details.Causes {
			if c.Field != "" {
				out = append(out, c.Field+": "+c.Message)
			} else {
				out = append(out, c.Message)
			}
		}
		return out
	}
	return []string{err.Error()}
}

// validate decodes strictly and runs the webhook, before and after the controller's defaulting.
// It returns the decoded object (nil when it does not decode) and the verdict.
func validate(raw []byte) (*machinelearningv1.SeldonDeployment, verdict) {
	var sdep machinelearningv1.SeldonDeployment
	strictErrs, err := kjson.UnmarshalStrict(raw, &sdep)
	if err != nil {
		return nil, newVerdict([]string{"decode: " + err.Error()})
	}
	if len(strictErrs) > 0 {
		var msgs []string
		for _, e := range strictErrs {
			msgs = append(msgs, "strict decoding: "+e.Error())
		}
		return nil, newVerdict(msgs)
	}
	if sdep.APIVersion != machinelearningv1.GroupVersion.String() || sdep.Kind != "SeldonDeployment" {
		return nil, newVerdict([]string{fmt.Sprintf("not a %s SeldonDeployment: %s %s", machinelearningv1.GroupVersion, sdep.APIVersion, sdep.Kind)})
	}
	// The webhook sees the object as the API server admits it: no defaulting webhook runs first.
	errs := fieldErrors(sdep.DeepCopy().ValidateCreate())
	seen := map[string]bool{}
	for _, e := range errs {
		seen[e] = true
	}
	defaulted := sdep.DeepCopy()
	defaulted.Default()
	for _, e := range fieldErrors(defaulted.ValidateCreate()) {
		if !seen[e] {
			errs = append(errs, "after Default(): "+e)
		}
	}
	return &sdep, newVerdict(errs)
}

func render(raw []byte, istioEnabled bool) verdict {
	sdep, v := validate(raw)
	if !v.OK {
		return v
	}
	objects, err := reconcile(sdep, istioEnabled)
	if err != nil {
		return newVerdict([]string{"controller: " + err.Error()})
	}
	v.Objects = objects
	return v
}

func reconcile(sdep *machinelearningv1.SeldonDeployment, istioEnabled bool) ([]map[string]any, error) {
	if sdep.Namespace == "" {
		sdep.Namespace = "default"
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, machinelearningv1.AddToScheme, istio.AddToScheme} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	if sdep.UID == "" {
		sdep.UID = types.UID("00000000-0000-0000-0000-000000000001") // owner references need one
	}
	original := sdep.DeepCopy()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sdep.Namespace}}
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(ns, sdep).Build()
	r := &controllers.SeldonDeploymentReconciler{
		Client:    cl,
		Log:       logr.Discard(),
		Scheme:    scheme,
		Recorder:  record.NewFakeRecorder(1000),
		ClientSet: kubefake.NewSimpleClientset(),
	}
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: sdep.Namespace, Name: sdep.Name}}
	if _, err := r.Reconcile(ctx, req); err != nil {
		return nil, err
	}
	if istioEnabled {
		// The controller writes VirtualServices and DestinationRules once every Deployment is
		// available: make them so, as the Deployment controller would, and reconcile again.
		// This fake client has no status subresource: the controller's status update also stored
		// the spec it had defaulted in memory, which the API server would have ignored. Put the
		// spec back as the API server keeps it.
		var stored machinelearningv1.SeldonDeployment
		if err := cl.Get(ctx, req.NamespacedName, &stored); err != nil {
			return nil, err
		}
		stored.Spec = *original.Spec.DeepCopy()
		if err := cl.Update(ctx, &stored); err != nil {
			return nil, err
		}
		var deps appsv1.DeploymentList
		if err := cl.List(ctx, &deps, client.InNamespace(sdep.Namespace)); err != nil {
			return nil, err
		}
		for i := range deps.Items {
			d := &deps.Items[i]
			n := int32(1)
			if d.Spec.Replicas != nil {
				n = *d.Spec.Replicas
			}
			d.Status = appsv1.DeploymentStatus{
				ObservedGeneration: d.Generation, Replicas: n, UpdatedReplicas: n, ReadyReplicas: n, AvailableReplicas: n,
				Conditions: []appsv1.DeploymentCondition{
					{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable"},
					{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "NewReplicaSetAvailable"},
				},
			}
			if err := cl.Update(ctx, d); err != nil {
				return nil, err
			}
		}
		if _, err := r.Reconcile(ctx, req); err != nil {
			return nil, err
		}
	}
	var out []map[string]any
	lists := []struct {
		list       client.ObjectList
		apiVersion string
		kind       string
	}{
		{&appsv1.DeploymentList{}, "apps/v1", "Deployment"},
		{&corev1.ServiceList{}, "v1", "Service"},
		{&autoscalingv2.HorizontalPodAutoscalerList{}, "autoscaling/v2", "HorizontalPodAutoscaler"},
		{&policyv1.PodDisruptionBudgetList{}, "policy/v1", "PodDisruptionBudget"},
		{&istio.VirtualServiceList{}, "networking.istio.io/v1alpha3", "VirtualService"},
		{&istio.DestinationRuleList{}, "networking.istio.io/v1alpha3", "DestinationRule"},
	}
	for _, l := range lists {
		if err := cl.List(ctx, l.list, client.InNamespace(sdep.Namespace)); err != nil {
			return nil, err
		}
		items, err := meta.ExtractList(l.list)
		if err != nil {
			return nil, err
		}
		var objs []map[string]any
		for _, item := range items {
			// encoding/json, not the unstructured converter: Istio's specs are protobuf messages
			// with their own JSON form.
			b, err := json.Marshal(item)
			if err != nil {
				return nil, err
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				return nil, err
			}
			m["apiVersion"], m["kind"] = l.apiVersion, l.kind
			objs = append(objs, m)
		}
		sort.Slice(objs, func(i, j int) bool { return name(objs[i]) < name(objs[j]) })
		out = append(out, objs...)
	}
	return out, nil
}

func name(obj map[string]any) string {
	md, _ := obj["metadata"].(map[string]any)
	n, _ := md["name"].(string)
	return n
}
