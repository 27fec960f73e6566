// Package install proves the chart and the images as an operator installs
// them: helm lint and template (defaults, every option incl.
// cert-manager), a server-side dry-run of every object, SubjectAccessReviews
// per ServiceAccount, schema errors named, samples accepted, static
// binaries; make deploy's Secrets made once and kept, its render applied
// with every mount found; the default render applied for real, every
// mounted Secret and ConfigMap existing or optional; every common knob
// reaching its pod; the alerts and dashboard reading only exported series,
// each alert's runbook in operations.md; every Service address the docs
// name; a CRD upgrade adding a field; the uninstall hook's RBAC; the image
// workflow through actionlint.
//
// Runs on: envtest, the pinned helm, kubectl, actionlint.
package install
