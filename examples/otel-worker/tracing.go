package main

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/nanoservice/core-fanout/client"
)

// The attributes of a delivery span. The messaging.* names are
// OpenTelemetry's semantic conventions for messaging; the attempt is
// fanout's own (1 for the first delivery, then 2, 3, ...).
const (
	attrSystem    = attribute.Key("messaging.system")
	attrOperation = attribute.Key("messaging.operation.type")
	attrTopic     = attribute.Key("messaging.destination.name")
	attrPartition = attribute.Key("messaging.destination.partition.id")
	attrOffset    = attribute.Key("messaging.kafka.offset")
	attrAttempt   = attribute.Key("fanout.delivery.attempt")
)

// headers is a propagation.TextMapCarrier over a record's headers: the
// producer's tracer wrote its trace context there (W3C traceparent,
// tracestate, baggage), and the daemon delivers the headers unchanged.
type headers []client.Header

// Get returns the value of the first header key, or "".
func (h *headers) Get(key string) string {
	for _, x := range *h {
		if x.Key == key {
			return string(x.Value)
		}
	}
	return ""
}

// Set replaces the value of header key, or adds it: what a producer's
// propagator calls to inject its trace context.
func (h *headers) Set(key, value string) {
	for i, x := range *h {
		if x.Key == key {
			(*h)[i].Value = []byte(value)
			return
		}
	}
	*h = append(*h, client.Header{Key: key, Value: []byte(value)})
}

// Keys lists the headers' keys.
func (h *headers) Keys() []string {
	out := make([]string, len(*h))
	for i, x := range *h {
		out[i] = x.Key
	}
	return out
}

// traced returns a client.Consume handler that runs next in a span of its
// own for each delivery attempt: a child of the producer's span when the
// record's headers carry its trace context (else the root of a new trace),
// with the attempt number, the partition and the offset as attributes, and
// the handler's error as the span's status. next's context carries the
// span: what next calls (an HTTP request with the context injected) joins
// the trace.
func traced(tracer trace.Tracer, prop propagation.TextMapPropagator, topic string,
	next func(context.Context, *client.Message) error) func(context.Context, *client.Message) error {
	return func(ctx context.Context, m *client.Message) error {
		hs := headers(m.Headers)
		ctx = prop.Extract(ctx, &hs)
		ctx, span := tracer.Start(ctx, "process "+topic, trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				attrSystem.String("kafka"),
				attrOperation.String("process"),
				attrTopic.String(topic),
				attrPartition.String(strconv.Itoa(int(m.Partition))),
				attrOffset.Int64(m.Offset),
				attrAttempt.Int(m.Attempt),
			))
		defer span.End()
		err := next(ctx, m)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		return err
	}
}
