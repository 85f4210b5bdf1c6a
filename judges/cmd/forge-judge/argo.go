package main

import (
	"context"
	"fmt"
	"os"

	wfv1 "github.com/argoproj/argo-workflows/v4/pkg/apis/workflow/v1alpha1"
	"github.com/argoproj/argo-workflows/v4/pkg/client/clientset/versioned/fake"
	"github.com/argoproj/argo-workflows/v4/util/logging"
	"github.com/argoproj/argo-workflows/v4/workflow/templateresolution"
	"github.com/argoproj/argo-workflows/v4/workflow/validate"
)

// argoCtx carries the logger every Argo entry point requires (logging.RequireLoggerFromContext).
func argoCtx() context.Context {
	return logging.WithLogger(context.Background(), logging.NewSlogLoggerCustom(logging.Error, logging.Text, os.Stderr))
}

// The three callers of validate.ValidateWorkflow, with the options each passes (v4.0.5):
//   - the controller, once per new Workflow: workflow/controller/operator.go:4323, ValidateOpts{}
//   - `argo submit`: workflow/util/util.go:189 SubmitWorkflow, ValidateOpts{Submit: true}
//   - `argo lint`:   pkg/apiclient/offline-workflow-service-client.go:74, ValidateOpts{Lint: true}
var argoCallers = []struct {
	name string
	opts validate.ValidateOpts
}{
	{"controller", validate.ValidateOpts{}},
	{"argo submit", validate.ValidateOpts{Submit: true}},
	{"argo lint", validate.ValidateOpts{Lint: true}},
}

func validateWorkflow(raw []byte) verdict {
	var wf wfv1.Workflow
	if errs := strictDecode(raw, &wf); len(errs) > 0 {
		return newVerdict(errs, nil)
	}
	if wf.Kind != "Workflow" || wf.APIVersion != "argoproj.io/v1alpha1" {
		return newVerdict([]string{fmt.Sprintf("not an argoproj.io/v1alpha1 Workflow: %s %s", wf.APIVersion, wf.Kind)}, nil)
	}
	ctx := argoCtx()
	// The controller wraps its clientset's WorkflowTemplates/ClusterWorkflowTemplates; Forge's
	// Workflows reference none, so an empty fake clientset answers the same way (NotFound).
	client := fake.NewSimpleClientset()
	wftmpl := templateresolution.WrapWorkflowTemplateInterface(client.ArgoprojV1alpha1().WorkflowTemplates(wf.Namespace))
	cwftmpl := templateresolution.WrapClusterWorkflowTemplateInterface(client.ArgoprojV1alpha1().ClusterWorkflowTemplates())
	var errs []string
	for _, c := range argoCallers {
		// ValidateWorkflow may fill in defaults; each caller gets the object as submitted.
		if err := validate.ValidateWorkflow(ctx, wftmpl, cwftmpl, wf.DeepCopy(), nil, c.opts); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", c.name, err))
		}
	}
	return newVerdict(errs, nil)
}
