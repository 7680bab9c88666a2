#!/bin/sh
# Regenerate api/{process,filesystem,agentpb} from api/proto. The generated
# code is committed: building airlock needs no protoc. Needs protoc
# (Debian: protobuf-compiler), protoc-gen-go and protoc-gen-connect-go at
# the versions go.mod pins.
set -eu
cd "$(dirname "$0")/.."
command -v protoc >/dev/null || { apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null; }
. scripts/go-env.sh
GOBIN="$PWD/.bin" go install google.golang.org/protobuf/cmd/protoc-gen-go connectrpc.com/connect/cmd/protoc-gen-connect-go
PATH="$PWD/.bin:$PATH" protoc -I api/proto \
	--go_out=. --go_opt=module=github.com/airlock-sandbox/airlock \
	--connect-go_out=. --connect-go_opt=module=github.com/airlock-sandbox/airlock \
	api/proto/process/process.proto api/proto/filesystem/filesystem.proto api/proto/agent/agent.proto
