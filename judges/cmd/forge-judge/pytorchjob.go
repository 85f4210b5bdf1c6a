package main

import (
	"context"
	"fmt"

	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apiserver/pkg/storage/names"

	trainingoperator "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"github.com/kubeflow/training-operator/pkg/webhooks/pytorch"
)

// validatePyTorchJob runs what the API server runs on `create`: a strict decode, then the
// Training Operator's validating webhook (pkg/webhooks/pytorch Webhook.ValidateCreate).
// The operator has no defaulting webhook, so the object reaches the validator as written
// (with the name the API server generates from generateName).
func validatePyTorchJob(raw []byte) verdict {
	var job trainingoperator.PyTorchJob
	if errs := strictDecode(raw, &job); len(errs) > 0 {
		return newVerdict(errs, nil)
	}
	if job.Kind != trainingoperator.PyTorchJobKind || job.APIVersion != trainingoperator.SchemeGroupVersion.String() {
		return newVerdict([]string{fmt.Sprintf("not a %s PyTorchJob: %s %s", trainingoperator.SchemeGroupVersion, job.APIVersion, job.Kind)}, nil)
	}
	if job.Name == "" && job.GenerateName != "" {
		// The API server names the object before admission; the webhook checks that name.
		job.Name = names.SimpleNameGenerator.GenerateName(job.GenerateName)
	}
	warnings, err := (&pytorch.Webhook{}).ValidateCreate(context.Background(), &job)
	var errs []string
	if agg, ok := err.(utilerrors.Aggregate); ok { // one message per field error, as kubectl shows them
		for _, e := range agg.Errors() {
			errs = append(errs, e.Error())
		}
	} else if err != nil {
		errs = append(errs, err.Error())
	}
	return newVerdict(errs, warnings)
}
