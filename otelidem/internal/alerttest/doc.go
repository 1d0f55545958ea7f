// Package alerttest checks the alert rules of otelidem's README with
// Prometheus's own PromQL engine, on metrics that otelidem exports through
// OpenTelemetry's Prometheus exporter. It is a module of its own, so that
// Prometheus stays out of otelidem's go.mod; it holds tests only.
package alerttest
