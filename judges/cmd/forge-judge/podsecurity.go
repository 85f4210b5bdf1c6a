package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	psaadmission "k8s.io/pod-security-admission/admission"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"

	wfv1 "github.com/argoproj/argo-workflows/v4/pkg/apis/workflow/v1alpha1"
	wfcommon "github.com/argoproj/argo-workflows/v4/workflow/common"
	trainingoperator "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	tocfg "github.com/kubeflow/training-operator/pkg/config"
	topytorch "github.com/kubeflow/training-operator/pkg/controller.v1/pytorch"
)

// pod-security: the Pod Security admission's own evaluator (k8s.io/pod-security-admission,
// policy.NewEvaluator(policy.DefaultChecks())) over every pod an object makes.
//
// Input: one object, an array of them, or
//
//	{"level": "restricted", "version": "latest",     (the namespace's enforce label and its -version)
//	 "argoExecutor": {<Container>},                   (the workflow-controller ConfigMap's `executor`)
//	 "trainingOperator": {"initContainerTemplate": "<YAML>"},
//	 "objects": [...]}
//
// Objects: anything the admission's own DefaultPodSpecExtractor reads (Pod, Deployment, ReplicaSet,
// StatefulSet, DaemonSet, Job, CronJob, PodTemplate, ReplicationController), an Argo Workflow (one
// pod per template that runs one, assembled as v4.0.5's controller does: see workflowPods), a
// Kubeflow PyTorchJob (one pod per replica type), a SeldonDeployment (one pod per predictor
// component). A Workflow's resource templates that create a PyTorchJob also yield that job's pods.
//
// What the controllers add themselves is judged only when the input says how they are configured:
// with "argoExecutor", Argo's init and wait containers (and a resource template's main container)
// as newExecContainer makes them from that configuration; with "trainingOperator", the operator's
// own PyTorchJobReconciler.SetClusterSpec runs on each replica (its env, and the init-pytorch
// container it adds to workers from the template, "" for its built-in one). Without them, only
// what the object itself says is judged.
//
// Output per object: {ok, errors, pods: [{pod, containers, ok, forbidden}]}; an error reads like the API
// server's refusal: `<pod>: violates PodSecurity "restricted:latest": <ForbiddenDetail>`.

type podSecurityInput struct {
	Level            string            `json:"level"`
	Version          string            `json:"version"`
	ArgoExecutor     *corev1.Container `json:"argoExecutor"`
	TrainingOperator *trainingOpInput  `json:"trainingOperator"`
	Objects          []json.RawMessage `json:"objects"`
}

type trainingOpInput struct {
	InitContainerTemplate string `json:"initContainerTemplate"`
}

type podVerdict struct {
	Pod string `json:"pod"`
	// Containers: the init containers, then the others, by name (what was judged).
	Containers []string `json:"containers"`
	OK         bool     `json:"ok"`
	Forbidden  string   `json:"forbidden,omitempty"`
}

type podSecurityVerdict struct {
	OK     bool         `json:"ok"`
	Errors []string     `json:"errors"`
	Pods   []podVerdict `json:"pods"`
}

// namedPod is one pod an object makes, as the evaluator reads it.
type namedPod struct {
	name string
	meta metav1.ObjectMeta
	spec corev1.PodSpec
}

type podJudge struct {
	evaluator policy.Evaluator
	lv        psaapi.LevelVersion
	executor  *corev1.Container
	trainOp   bool
}

func podSecurity(in []byte) any {
	var req podSecurityInput
	single := false
	var probe map[string]json.RawMessage
	switch trimmed := bytes.TrimSpace(in); {
	case len(trimmed) > 0 && trimmed[0] == '[':
		if err := json.Unmarshal(trimmed, &req.Objects); err != nil {
			fail("pod-security input: %v", err)
		}
	case json.Unmarshal(trimmed, &probe) != nil:
		fail("pod-security input is not a JSON object or array")
	case probe["objects"] != nil && probe["kind"] == nil:
		if errs := strictDecode(trimmed, &req); len(errs) > 0 {
			fail("pod-security input: %s", strings.Join(errs, "; "))
		}
	default:
		req.Objects, single = []json.RawMessage{trimmed}, true
	}
	if req.Level == "" {
		req.Level = string(psaapi.LevelRestricted)
	}
	if req.Version == "" {
		req.Version = "latest"
	}
	level, err := psaapi.ParseLevel(req.Level)
	if err != nil {
		fail("pod-security: %v", err)
	}
	version, err := psaapi.ParseVersion(req.Version)
	if err != nil {
		fail("pod-security: %v", err)
	}
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		fail("pod-security: %v", err)
	}
	j := &podJudge{evaluator: evaluator, lv: psaapi.LevelVersion{Level: level, Version: version}, executor: req.ArgoExecutor}
	if req.TrainingOperator != nil {
		j.trainOp = true
		if err := configureTrainingOperator(req.TrainingOperator.InitContainerTemplate); err != nil {
			fail("pod-security: %v", err)
		}
	}
	out := make([]podSecurityVerdict, 0, len(req.Objects))
	for _, raw := range req.Objects {
		out = append(out, j.judge(raw))
	}
	if single {
		return out[0]
	}
	return out
}

// configureTrainingOperator sets what the operator's flags set (cmd/training-operator.v1/main.go:
// --pytorch-init-container-image, -template-file, -max-tries, with their defaults); an empty
// template leaves the operator's built-in one.
func configureTrainingOperator(template string) error {
	tocfg.Config.PyTorchInitContainerImage = tocfg.PyTorchInitContainerImageDefault
	tocfg.Config.PyTorchInitContainerMaxTries = tocfg.PyTorchInitContainerMaxTriesDefault
	tocfg.Config.PyTorchInitContainerTemplateFile = ""
	if template == "" {
		return nil
	}
	f, err := os.CreateTemp("", "forge-judge-init-container-*.yaml")
	if err != nil {
		return err
	}
	// read once, by the operator's sync.Once generator, during this process: removed at exit
	if _, err := f.WriteString(template); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	tocfg.Config.PyTorchInitContainerTemplateFile = f.Name()
	cleanups = append(cleanups, func() { _ = os.Remove(f.Name()) })
	return nil
}

// cleanups run before the process exits (main calls runCleanups).
var cleanups []func()

func runCleanups() {
	for _, c := range cleanups {
		c()
	}
}

func (j *podJudge) judge(raw []byte) podSecurityVerdict {
	pods, errs := j.pods(raw)
	v := podSecurityVerdict{Errors: errs, Pods: []podVerdict{}}
	for _, p := range pods {
		agg := policy.AggregateCheckResults(j.evaluator.EvaluatePod(j.lv, &p.meta, &p.spec))
		pv := podVerdict{Pod: p.name, OK: agg.Allowed, Containers: []string{}}
		for _, c := range append(append([]corev1.Container{}, p.spec.InitContainers...), p.spec.Containers...) {
			pv.Containers = append(pv.Containers, c.Name)
		}
		if !agg.Allowed {
			// the API server's own wording (admission.go, EvaluatePod)
			pv.Forbidden = fmt.Sprintf("violates PodSecurity %q: %s", j.lv.String(), agg.ForbiddenDetail())
			v.Errors = append(v.Errors, p.name+": "+pv.Forbidden)
		}
		v.Pods = append(v.Pods, pv)
	}
	if v.Errors == nil {
		v.Errors = []string{}
	}
	v.OK = len(v.Errors) == 0
	return v
}

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name         string `json:"name"`
		GenerateName string `json:"generateName"`
	} `json:"metadata"`
}

func (j *podJudge) pods(raw []byte) ([]namedPod, []string) {
	var tm typeMeta
	if err := json.Unmarshal(raw, &tm); err != nil {
		return nil, []string{"decode: " + err.Error()}
	}
	name := tm.Metadata.Name
	if name == "" {
		name = tm.Metadata.GenerateName
	}
	switch {
	case tm.Kind == "Workflow" && tm.APIVersion == "argoproj.io/v1alpha1":
		var wf wfv1.Workflow
		if errs := strictDecode(raw, &wf); len(errs) > 0 {
			return nil, errs
		}
		return j.workflowPods(&wf)
	case tm.Kind == trainingoperator.PyTorchJobKind && tm.APIVersion == trainingoperator.SchemeGroupVersion.String():
		var job trainingoperator.PyTorchJob
		if errs := strictDecode(raw, &job); len(errs) > 0 {
			return nil, errs
		}
		return j.pytorchJobPods(&job, "PyTorchJob "+name)
	case tm.Kind == "SeldonDeployment" && strings.HasPrefix(tm.APIVersion, "machinelearning.seldon.io/"):
		return seldonPods(raw, "SeldonDeployment "+name)
	}
	// what the admission itself extracts pods from, decoded by client-go's scheme (strictly)
	obj, err := runtime.Decode(strictCodecs.UniversalDeserializer(), raw)
	if err != nil {
		return nil, []string{fmt.Sprintf("%s %s: %v", tm.Kind, name, err)}
	}
	meta, spec, err := psaadmission.DefaultPodSpecExtractor{}.ExtractPodSpec(obj)
	if err != nil {
		return nil, []string{fmt.Sprintf("%s %s: %v", tm.Kind, name, err)}
	}
	if spec == nil {
		return nil, nil
	}
	return []namedPod{{name: tm.Kind + " " + name, meta: *meta, spec: *spec}}, nil
}

var strictCodecs = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict)

// workflowPods: the pod of each template that runs one, as v4.0.5's createWorkflowPod
// (workflow/controller/workflowpod.go) builds it, in the fields the checks read:
//   - containers: the template's container / script / containerSet containers (named `main` but
//     in a containerSet), its sidecars; init containers: its initContainers;
//   - with an executor configuration: the `init` container first, the `wait` container before
//     the main ones (not for a resource template, whose `main` container is the executor), each
//     newExecContainer's: the configured securityContext, or for a resource template without one
//     common.MinimalCtrSC() (readOnlyRootFilesystem only on its main container);
//   - spec.securityContext: the template's, else the Workflow's (addSchedulingConstraints);
//     hostNetwork: the Workflow's;
//   - volumes: the controller's own emptyDirs (var-run-argo, tmp-dir-argo), the template's, and
//     the Workflow's that a container mounts (createVolumes, addVolumeReferences);
//   - metadata: the Workflow's podMetadata, then the template's (addMetadata).
//
// podSpecPatch and templateDefaults are not modelled: a Workflow using them is an error here.
func (j *podJudge) workflowPods(wf *wfv1.Workflow) ([]namedPod, []string) {
	var errs []string
	if wf.Spec.PodSpecPatch != "" || wf.Spec.TemplateDefaults != nil {
		errs = append(errs, "Workflow "+wf.Name+": podSpecPatch / templateDefaults are not modelled by this judge")
	}
	var pods []namedPod
	for i := range wf.Spec.Templates {
		tmpl := &wf.Spec.Templates[i]
		what := fmt.Sprintf("Workflow %s template %s", wf.Name, tmpl.Name)
		if tmpl.PodSpecPatch != "" {
			errs = append(errs, what+": podSpecPatch is not modelled by this judge")
		}
		var main []corev1.Container
		switch tmpl.GetType() {
		case wfv1.TemplateTypeContainer:
			main = []corev1.Container{*tmpl.Container}
		case wfv1.TemplateTypeScript:
			main = []corev1.Container{tmpl.Script.Container}
		case wfv1.TemplateTypeContainerSet:
			for _, c := range tmpl.ContainerSet.Containers {
				main = append(main, c.Container)
			}
		case wfv1.TemplateTypeResource, wfv1.TemplateTypeData:
			if tmpl.GetType() == wfv1.TemplateTypeResource {
				if more, e := j.manifestPods(tmpl.Resource.Manifest, what); len(e) > 0 {
					errs = append(errs, e...)
				} else {
					pods = append(pods, more...)
				}
			}
		default:
			continue // dag, steps, suspend, http, plugin: no pod
		}
		for k := range main {
			if tmpl.GetType() != wfv1.TemplateTypeContainerSet || main[k].Name == "" {
				main[k].Name = wfcommon.MainContainerName
			}
		}
		pod := namedPod{name: what}
		if j.executor != nil {
			pod.spec.InitContainers = append(pod.spec.InitContainers, j.execContainer(wfcommon.InitContainerName, tmpl))
			switch tmpl.GetType() {
			case wfv1.TemplateTypeResource:
				main = []corev1.Container{j.execContainer(wfcommon.MainContainerName, tmpl)}
			case wfv1.TemplateTypeData:
				main = []corev1.Container{j.execContainer(wfcommon.MainContainerName, tmpl)}
			default:
				pod.spec.Containers = append(pod.spec.Containers, j.execContainer(wfcommon.WaitContainerName, tmpl))
			}
		} else if tmpl.GetType() == wfv1.TemplateTypeResource || tmpl.GetType() == wfv1.TemplateTypeData {
			pod.name += " (its only container is Argo's executor: not judged without its configuration)"
		}
		pod.spec.Containers = append(pod.spec.Containers, main...)
		for _, c := range tmpl.InitContainers {
			pod.spec.InitContainers = append(pod.spec.InitContainers, c.Container)
		}
		for _, c := range tmpl.Sidecars {
			pod.spec.Containers = append(pod.spec.Containers, c.Container)
		}
		if tmpl.SecurityContext != nil {
			pod.spec.SecurityContext = tmpl.SecurityContext.DeepCopy()
		} else if wf.Spec.SecurityContext != nil {
			pod.spec.SecurityContext = wf.Spec.SecurityContext.DeepCopy()
		}
		if wf.Spec.HostNetwork != nil {
			pod.spec.HostNetwork = *wf.Spec.HostNetwork
		}
		pod.spec.Volumes = append(pod.spec.Volumes, argoVolumes()...)
		pod.spec.Volumes = append(pod.spec.Volumes, tmpl.Volumes...)
		have := map[string]bool{}
		for _, v := range pod.spec.Volumes {
			have[v.Name] = true
		}
		for _, c := range append(append([]corev1.Container{}, pod.spec.InitContainers...), pod.spec.Containers...) {
			for _, m := range c.VolumeMounts {
				if have[m.Name] {
					continue
				}
				for _, v := range wf.Spec.Volumes {
					if v.Name == m.Name {
						pod.spec.Volumes = append(pod.spec.Volumes, v)
						have[v.Name] = true
					}
				}
			}
		}
		pod.meta.Labels, pod.meta.Annotations = map[string]string{}, map[string]string{}
		for _, md := range []*wfv1.Metadata{wf.Spec.PodMetadata, &tmpl.Metadata} {
			if md == nil {
				continue
			}
			for k, v := range md.Labels {
				pod.meta.Labels[k] = v
			}
			for k, v := range md.Annotations {
				pod.meta.Annotations[k] = v
			}
		}
		pods = append(pods, pod)
	}
	return pods, errs
}

// argoVolumes: the emptyDirs every workflow pod gets (workflowpod.go volumeVarArgo, volumeTmpDir).
func argoVolumes() []corev1.Volume {
	empty := corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}
	return []corev1.Volume{{Name: "var-run-argo", VolumeSource: empty}, {Name: "tmp-dir-argo", VolumeSource: empty}}
}

// execContainer: newExecContainer's security context (workflowpod.go), the only field the checks read.
func (j *podJudge) execContainer(name string, tmpl *wfv1.Template) corev1.Container {
	c := corev1.Container{Name: name, Image: "argoexec"}
	if j.executor.SecurityContext != nil {
		c.SecurityContext = j.executor.SecurityContext.DeepCopy()
	}
	if tmpl.GetType() == wfv1.TemplateTypeResource && c.SecurityContext == nil {
		c.SecurityContext = wfcommon.MinimalCtrSC()
		c.SecurityContext.ReadOnlyRootFilesystem = nil
		if name != wfcommon.InitContainerName && name != wfcommon.WaitContainerName {
			t := true
			c.SecurityContext.ReadOnlyRootFilesystem = &t
		}
	}
	return c
}

// manifestPods: the pods of what a resource template creates (a PyTorchJob; other kinds make none
// Forge renders). Argo reads the manifest as YAML; Forge writes JSON, which is YAML.
func (j *podJudge) manifestPods(manifest, what string) ([]namedPod, []string) {
	var tm typeMeta
	if err := json.Unmarshal([]byte(manifest), &tm); err != nil {
		return nil, []string{what + ": its manifest is not JSON: " + err.Error()}
	}
	if tm.Kind != trainingoperator.PyTorchJobKind {
		return nil, nil
	}
	var job trainingoperator.PyTorchJob
	if errs := strictDecode([]byte(manifest), &job); len(errs) > 0 {
		return nil, errs
	}
	return j.pytorchJobPods(&job, what+" → PyTorchJob")
}

// pytorchJobPods: one pod per replica type (every replica of a type has the same template), after
// the operator's SetClusterSpec when its configuration was given.
func (j *podJudge) pytorchJobPods(job *trainingoperator.PyTorchJob, what string) ([]namedPod, []string) {
	if job.Name == "" {
		job.Name = job.GenerateName + "x"
	}
	if j.trainOp {
		// the controller defaults the job (r.Scheme.Default, pytorchjob_controller.go) before it
		// makes pods: the master's port, which the env it sets names, comes from there
		trainingoperator.SetObjectDefaults_PyTorchJob(job)
	}
	var types []string
	for rt := range job.Spec.PyTorchReplicaSpecs {
		types = append(types, string(rt))
	}
	sort.Strings(types)
	var pods []namedPod
	var errs []string
	for _, rt := range types {
		spec := job.Spec.PyTorchReplicaSpecs[trainingoperator.ReplicaType(rt)]
		if spec == nil {
			continue
		}
		tmpl := spec.Template.DeepCopy()
		if j.trainOp {
			r := &topytorch.PyTorchJobReconciler{Log: logr.Discard()}
			if err := r.SetClusterSpec(job, tmpl, strings.ToLower(rt), "0"); err != nil {
				errs = append(errs, fmt.Sprintf("%s %s: the operator's SetClusterSpec: %v", what, rt, err))
				continue
			}
		}
		pods = append(pods, namedPod{name: fmt.Sprintf("%s replica %s", what, rt), meta: tmpl.ObjectMeta, spec: tmpl.Spec})
	}
	return pods, errs
}

// seldonPods: each predictor component's pod spec (the fields Forge writes; what the operator adds
// is judged from its own Deployments, seldon-judge render).
func seldonPods(raw []byte, what string) ([]namedPod, []string) {
	var sd struct {
		Spec struct {
			Predictors []struct {
				Name           string `json:"name"`
				ComponentSpecs []struct {
					Metadata metav1.ObjectMeta `json:"metadata"`
					Spec     json.RawMessage   `json:"spec"`
				} `json:"componentSpecs"`
			} `json:"predictors"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &sd); err != nil {
		return nil, []string{what + ": decode: " + err.Error()}
	}
	var pods []namedPod
	var errs []string
	for _, p := range sd.Spec.Predictors {
		for i, c := range p.ComponentSpecs {
			name := fmt.Sprintf("%s predictor %s component %d", what, p.Name, i)
			var spec corev1.PodSpec
			if e := strictDecode(c.Spec, &spec); len(e) > 0 {
				errs = append(errs, name+": "+strings.Join(e, "; "))
				continue
			}
			pods = append(pods, namedPod{name: name, meta: c.Metadata, spec: spec})
		}
	}
	return pods, errs
}
