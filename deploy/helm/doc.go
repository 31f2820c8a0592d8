// Package helm holds the tests of the stillthere Helm chart in
// deploy/helm/stillthere: they render it with the helm binary, decode every
// manifest strictly into the Kubernetes API types, and check the
// invariants the services depend on.
package helm
