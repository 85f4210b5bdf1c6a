#!/usr/bin/env bash
# Build Seldon Core v1's executor (the service orchestrator, module github.com/seldonio/seldon-core/executor;
# the `executor` binary of upstream's executor/Dockerfile.executor, package cmd/executor) into a cache keyed
# by version and source digest, for devkit/node/seldon.py (ensure_executor) and
# tests/cluster/test_seldon_executor.py.
#
#   judges/seldon/build-executor.sh   -> prints the binary's path on stdout; progress on stderr
#
# Output: ${FORGE_CACHE:-$HOME/.cache/forge}/bin/seldon-executor-<SELDON_OPERATOR_VERSION>-<digest>/executor.
#
# Source: seldon_src (scripts/cluster/gocache.sh), as build-operator.sh takes the operator's: the module
# proxy first — it refuses github.com/seldonio/seldon-core/executor (403 "This module version is not
# available.") — then the unchanged upstream copy in ../shared/vendor-src beside the checkout, checked to
# be that module and to name SELDON_OPERATOR_VERSION (one tag holds both modules) in its SOURCE.md. The
# operator comes the same way (seldon_operator_src).
# Module: the executor's OWN go.mod and go.sum (upstream's pins), -mod=readonly. Its go.mod replaces the
# operator with ./_operator and tensorflow's core with ./proto/tensorflow/core, so the build runs in a
# writable copy of executor/ (in the cache's temporary build folder, removed afterwards) into which the
# operator is copied as _operator, as upstream's Makefile (copy_operator) does; ../shared is only read.
# Every other module comes from the Go module proxy into the caches of the other builds.
# cgo is on, as in upstream's build image: github.com/confluentinc/confluent-kafka-go (the kafka server
# type and request logger) links its bundled static librdkafka through cgo and has no pure-Go build.
# The digest covers the executor's and the operator's Go sources (tests left out; go.mod and go.sum
# included), CGO_ENABLED and the Go version.
# Not used on the node: Forge renders every SeldonDeployment with seldon.io/no-engine "true".
# First build: see docs/test-cluster.md ("Seldon Core on the node").
set -euo pipefail
exec "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/build-operator.sh" executor
