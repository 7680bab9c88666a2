package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// Exporter sends records, after they are on disk, to an OpenTelemetry
// collector as OTLP logs (HTTP, JSON encoding). Each log record carries
// the record's sequence number and hash, so the collector also holds the
// log's head, apart from the log. Export never slows the log: batches the
// collector cannot take in time are dropped and counted.
type Exporter struct {
	url     string
	client  *http.Client
	queue   chan []Record
	dropped atomic.Int64
	failed  atomic.Int64
	done    chan struct{}
}

// NewExporter exports to endpoint (the collector's base URL, such as
// http://collector:4318).
func NewExporter(endpoint string) *Exporter {
	e := &Exporter{
		url:    endpoint + "/v1/logs",
		client: &http.Client{Timeout: 10 * time.Second},
		queue:  make(chan []Record, 64),
		done:   make(chan struct{}),
	}
	go e.run()
	return e
}

// Export queues a batch (a copy is kept).
func (e *Exporter) Export(batch []Record) {
	select {
	case e.queue <- append([]Record(nil), batch...):
	default:
		e.dropped.Add(int64(len(batch)))
	}
}

// Dropped and Failed count the records not exported: dropped because the
// collector was slow, failed because it refused them.
func (e *Exporter) Dropped() int64 { return e.dropped.Load() }

// Failed counts records the collector did not accept.
func (e *Exporter) Failed() int64 { return e.failed.Load() }

// Close sends what is queued and stops.
func (e *Exporter) Close() {
	close(e.queue)
	<-e.done
}

func (e *Exporter) run() {
	defer close(e.done)
	for batch := range e.queue {
		if err := e.send(batch); err != nil {
			e.failed.Add(int64(len(batch)))
		}
	}
}

type otlpValue struct {
	StringValue string `json:"stringValue,omitempty"`
	IntValue    string `json:"intValue,omitempty"`
}

type otlpAttr struct {
	Key   string    `json:"key"`
	Value otlpValue `json:"value"`
}

func str(k, v string) otlpAttr { return otlpAttr{Key: k, Value: otlpValue{StringValue: v}} }

func (e *Exporter) send(batch []Record) error {
	type logRecord struct {
		TimeUnixNano string     `json:"timeUnixNano"`
		SeverityText string     `json:"severityText"`
		Body         otlpValue  `json:"body"`
		Attributes   []otlpAttr `json:"attributes"`
	}
	logs := make([]logRecord, 0, len(batch))
	for i := range batch {
		r := &batch[i]
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		attrs := []otlpAttr{
			str("airlock.kind", r.Kind), str("airlock.source", r.Source), str("airlock.hash", r.Hash),
			{Key: "airlock.seq", Value: otlpValue{IntValue: strconv.FormatUint(r.Seq, 10)}},
		}
		for k, v := range map[string]string{"airlock.tenant": r.Tenant, "airlock.sandbox": r.Sandbox, "airlock.trigger": r.Trigger} {
			if v != "" {
				attrs = append(attrs, str(k, v))
			}
		}
		logs = append(logs, logRecord{TimeUnixNano: strconv.FormatInt(r.Time.UnixNano(), 10), SeverityText: "INFO", Body: otlpValue{StringValue: string(b)}, Attributes: attrs})
	}
	body := map[string]any{"resourceLogs": []any{map[string]any{
		"resource":  map[string]any{"attributes": []otlpAttr{str("service.name", "airlock")}},
		"scopeLogs": []any{map[string]any{"scope": map[string]any{"name": "airlock.audit"}, "logRecords": logs}},
	}}}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", e.url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := e.client.Do(req)
	if err != nil {
		return err
	}
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("collector answered %s", res.Status)
	}
	return nil
}
