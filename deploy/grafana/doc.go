// Package grafana holds the test of the Grafana dashboard stillthere.json:
// that it decodes, that its panels are laid out on Grafana's grid without
// overlap and query the chosen data source, and that every series they
// query is one the services publish.
package grafana
