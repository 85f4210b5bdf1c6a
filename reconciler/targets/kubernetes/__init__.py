"""The `kubernetes` target: a real cluster through the `kubernetes` client (target), its rollout
backend (rollout), Argo's Workflow status (workflow_status) and kubeconfig reading (kubeconfig).
Where a target writes: `target.KubernetesTarget.apply`."""
