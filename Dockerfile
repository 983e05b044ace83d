# syntax=docker/dockerfile:1
#
# The fanout daemon and its tools in a small non-root image:
#
#   docker build -t nanoservice/fanout .
#   docker run -d --link kafka:kafka --link zookeeper:zk \
#     nanoservice/fanout --id service_x --topic user_need
#
# With Docker links the daemon finds Kafka and ZooKeeper in the link
# variables (KAFKA_PORT_9092_TCP_ADDR, ZK_PORT_2181_TCP_ADDR, ...); otherwise
# pass --kafka and --zookeeper (or FANOUT_KAFKA, FANOUT_ZOOKEEPER).
# Other commands run the same way: docker run nanoservice/fanout tail --connect HOST:4987

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
# Modules first, so that the download layer is cached across source changes.
COPY go.mod go.sum ./
COPY client/go.mod client/go.sum client/
RUN go mod download
COPY . .
ARG VERSION=docker
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/fanout ./cmd/fanout \
 && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/example-consumer ./examples/consumer

# The example consumer of docker-compose.yml (docker build --target example-consumer).
FROM gcr.io/distroless/static-debian12:nonroot AS example-consumer
COPY --from=build /out/example-consumer /usr/local/bin/example-consumer
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/example-consumer"]

# The default target: the fanout image.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/fanout /usr/local/bin/fanout
USER nonroot:nonroot
# 4987: client connections (--listen). 9100: metrics (--metrics-listen,
# default :9100), once the daemon serves them.
EXPOSE 4987 9100
# Ready when the daemon leads or follows a known leader (its /readyz on
# --metrics-listen / FANOUT_METRICS_LISTEN); the image has no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["/usr/local/bin/fanout", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/fanout"]
