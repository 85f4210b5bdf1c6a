"""Planning: a Change per object (change), the field diff (diff), the Plan value (plan), reasons and
risk flags, the reviewer's additions (review), the impure edge that reads the target and renders
(session), the live plan (live) and the pull-request plan (pullrequest), applying (apply) and the
cluster prerequisites `doctor` checks. Where a plan is built: `session.make_plan` → `plan.build_plan`."""
