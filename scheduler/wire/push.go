package wire

import (
	"encoding/binary"
	"strconv"
	"time"
)

// Push is what one agent sends to every Envoy replica each cycle: the whole
// current state of the endpoints it scrapes. It replaces whatever that agent
// sent before.
type Push struct {
	// AgentID names the sender (the node name by default); non-empty.
	AgentID string
	// Seq grows with every push of one agent, across restarts too; the
	// receiver refuses a Seq not above the last it accepted from AgentID.
	Seq uint64
	// SendTime is the agent's clock when the push was built.
	SendTime time.Time
	// Endpoints are sorted by namespace and name, unique (see Normalize).
	Endpoints []EndpointState
}

// Validate checks p against lim exactly as DecodePush would check its
// encoding.
func (p *Push) Validate(lim Limits) error {
	lim = lim.resolved()
	if err := p.validate(&lim); err != nil {
		return err
	}
	return nil
}

func (p *Push) validate(lim *Limits) *Error {
	if err := checkString(p.AgentID, lim.MaxNameLen, false); err != nil {
		return err.at("push.agent_id")
	}
	if p.Seq == 0 {
		return errf(ErrInvalidField, "push.seq", -1, "sequence number 0")
	}
	if _, err := timeNanos(p.SendTime, "push.send_time"); err != nil {
		return err
	}
	if len(p.Endpoints) > lim.MaxEndpoints {
		return errf(ErrLimit, "push.endpoints", -1, strconv.Itoa(len(p.Endpoints))+" endpoints, limit "+strconv.Itoa(lim.MaxEndpoints))
	}
	return checkEndpointList(p.Endpoints, lim, "push.endpoints")
}

// AppendPush validates p and appends its encoding to dst. Nothing that
// DecodePush would reject is ever encoded.
func AppendPush(dst []byte, p *Push, lim Limits) ([]byte, error) {
	lim = lim.resolved()
	if err := p.validate(&lim); err != nil {
		return dst, err
	}
	start := len(dst)
	dst = append(dst, magicPush[0], magicPush[1], version1)
	dst = appendStr(dst, p.AgentID)
	dst = binary.LittleEndian.AppendUint64(dst, p.Seq)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(p.SendTime.UnixNano()))
	dst = binary.AppendUvarint(dst, uint64(len(p.Endpoints)))
	for i := range p.Endpoints {
		dst = appendEndpoint(dst, &p.Endpoints[i])
	}
	if n := len(dst) - start; n > lim.MaxPushBytes {
		return dst[:start], errf(ErrLimit, "push", -1, "encoded size "+strconv.Itoa(n)+" bytes, limit "+strconv.Itoa(lim.MaxPushBytes))
	}
	return dst, nil
}

// EncodePush is AppendPush to a new slice.
func EncodePush(p *Push, lim Limits) ([]byte, error) { return AppendPush(nil, p, lim) }

// DecodePush parses and validates one push. The result does not alias b.
func DecodePush(b []byte, lim Limits) (*Push, error) {
	d := newDecoder(b, lim, "push")
	d.header(magicPush, d.lim.MaxPushBytes)
	p := &Push{}
	p.AgentID = d.str("agent_id")
	if d.err == nil {
		if err := checkString(p.AgentID, d.lim.MaxNameLen, false); err != nil {
			d.fail(err.Kind, "agent_id", 3, err.Detail)
		}
	}
	seqAt := d.off
	p.Seq = d.u64("seq")
	if d.err == nil && p.Seq == 0 {
		d.fail(ErrInvalidField, "seq", seqAt, "sequence number 0")
	}
	p.SendTime = d.time("send_time")
	n := d.count("endpoints", d.lim.MaxEndpoints, minEndpointBytes)
	if d.err == nil && n > 0 {
		p.Endpoints = make([]EndpointState, n)
		d.adapters = make([]string, 0, 2*n)
		d.endpoints(p.Endpoints)
	}
	d.end()
	if d.err != nil {
		return nil, d.err
	}
	return p, nil
}
