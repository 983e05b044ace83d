module github.com/nanoservice/core-fanout/client

go 1.23

require github.com/nanoservice/core-fanout/protocol v0.0.0

require google.golang.org/protobuf v1.36.12 // indirect

replace github.com/nanoservice/core-fanout/protocol => ../protocol
