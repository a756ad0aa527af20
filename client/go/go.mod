module github.com/retry-budget/retry-budget/client/go

go 1.19

require (
	github.com/cenkalti/backoff/v4 v4.1.3
	github.com/prometheus/client_golang v1.14.0
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)
