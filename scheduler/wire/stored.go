package wire

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Stored is the receiver's view of every agent: what it keeps in Envoy
// shared data under one key, and what the filter turns into a
// scheduler.Snapshot.
type Stored struct {
	// Agents are sorted by AgentID, unique.
	Agents []AgentState
}

// AgentState is the latest accepted push of one agent.
type AgentState struct {
	AgentID string
	// LastSeq is the sequence number of that push.
	LastSeq uint64
	// Received is the receiver's clock when it accepted the push.
	Received time.Time
	// Endpoints are the push's endpoints, sorted and unique.
	Endpoints []EndpointState
}

// TotalEndpoints counts the endpoints of all agents.
func (s *Stored) TotalEndpoints() int {
	n := 0
	for i := range s.Agents {
		n += len(s.Agents[i].Endpoints)
	}
	return n
}

func (s *Stored) validate(lim *Limits) *Error {
	if len(s.Agents) > lim.MaxAgents {
		return errf(ErrLimit, "stored.agents", -1, strconv.Itoa(len(s.Agents))+" agents, limit "+strconv.Itoa(lim.MaxAgents))
	}
	if n := s.TotalEndpoints(); n > lim.MaxTotalEndpoints {
		return errf(ErrLimit, "stored.endpoints", -1, strconv.Itoa(n)+" endpoints in total, limit "+strconv.Itoa(lim.MaxTotalEndpoints))
	}
	for i := range s.Agents {
		a := &s.Agents[i]
		where := "stored.agents[" + strconv.Itoa(i) + "]"
		if err := checkString(a.AgentID, lim.MaxNameLen, false); err != nil {
			return err.at(where + ".agent_id")
		}
		if i > 0 && s.Agents[i-1].AgentID >= a.AgentID {
			return errf(ErrInvalidField, where, -1, "agents not sorted and unique: "+strconv.Quote(s.Agents[i-1].AgentID)+" then "+strconv.Quote(a.AgentID))
		}
		if a.LastSeq == 0 {
			return errf(ErrInvalidField, where+".last_seq", -1, "sequence number 0")
		}
		if _, err := timeNanos(a.Received, where+".received"); err != nil {
			return err
		}
		if len(a.Endpoints) > lim.MaxEndpoints {
			return errf(ErrLimit, where+".endpoints", -1, strconv.Itoa(len(a.Endpoints))+" endpoints, limit "+strconv.Itoa(lim.MaxEndpoints))
		}
		if err := checkEndpointList(a.Endpoints, lim, where+".endpoints"); err != nil {
			return err
		}
	}
	return nil
}

// AppendStored validates s and appends its encoding to dst.
func AppendStored(dst []byte, s *Stored, lim Limits) ([]byte, error) {
	lim = lim.resolved()
	if err := s.validate(&lim); err != nil {
		return dst, err
	}
	start := len(dst)
	dst = append(dst, magicStored[0], magicStored[1], version1)
	dst = binary.AppendUvarint(dst, uint64(len(s.Agents)))
	dst = binary.AppendUvarint(dst, uint64(s.TotalEndpoints()))
	for i := range s.Agents {
		a := &s.Agents[i]
		dst = appendStr(dst, a.AgentID)
		dst = binary.LittleEndian.AppendUint64(dst, a.LastSeq)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(a.Received.UnixNano()))
		dst = binary.AppendUvarint(dst, uint64(len(a.Endpoints)))
		for j := range a.Endpoints {
			dst = appendEndpoint(dst, &a.Endpoints[j])
		}
	}
	if n := len(dst) - start; n > lim.MaxStoredBytes {
		return dst[:start], errf(ErrLimit, "stored", -1, "encoded size "+strconv.Itoa(n)+" bytes, limit "+strconv.Itoa(lim.MaxStoredBytes))
	}
	return dst, nil
}

// EncodeStored is AppendStored to a new slice.
func EncodeStored(s *Stored, lim Limits) ([]byte, error) { return AppendStored(nil, s, lim) }

// storedVisitor receives what decodeStored reads, so DecodeStored and
// DecodeSnapshot share one parser but build different results.
type storedVisitor interface {
	// begin is called once with the announced counts, before any agent.
	begin(agents, endpoints int)
	// agent is called after an agent's header; it returns where to decode
	// that agent's endpoints (len(n)).
	agent(a *AgentState, n int) []EndpointState
	// agentDone is called after the agent's endpoints were decoded.
	agentDone(a *AgentState, eps []EndpointState)
}

func decodeStored(b []byte, lim Limits, v storedVisitor) *Error {
	d := newDecoder(b, lim, "stored")
	d.header(magicStored, d.lim.MaxStoredBytes)
	nAgents := d.count("agents", d.lim.MaxAgents, minAgentBytes)
	totalAt := d.off
	total := d.count("endpoints_total", d.lim.MaxTotalEndpoints, minEndpointBytes)
	if d.err != nil {
		return d.err
	}
	v.begin(nAgents, total)
	d.adapters = make([]string, 0, 2*total)
	seen := 0
	var prevID string
	for i := 0; i < nAgents; i++ {
		d.agentIdx = i
		var a AgentState
		idAt := d.off
		a.AgentID = d.str("agent_id")
		if d.err == nil {
			if err := checkString(a.AgentID, d.lim.MaxNameLen, false); err != nil {
				d.fail(err.Kind, "agent_id", idAt, err.Detail)
			} else if i > 0 && prevID >= a.AgentID {
				d.fail(ErrInvalidField, "agent_id", idAt, "agents not sorted and unique: "+strconv.Quote(prevID)+" then "+strconv.Quote(a.AgentID))
			}
		}
		prevID = a.AgentID
		seqAt := d.off
		a.LastSeq = d.u64("last_seq")
		if d.err == nil && a.LastSeq == 0 {
			d.fail(ErrInvalidField, "last_seq", seqAt, "sequence number 0")
		}
		a.Received = d.time("received")
		nAt := d.off
		n := d.count("endpoints", d.lim.MaxEndpoints, minEndpointBytes)
		if d.err == nil && seen+n > total {
			d.fail(ErrInvalidField, "endpoints", nAt, "more endpoints than endpoints_total announces ("+strconv.Itoa(total)+")")
		}
		if d.err != nil {
			return d.err
		}
		eps := v.agent(&a, n)
		d.endpoints(eps)
		if d.err != nil {
			return d.err
		}
		v.agentDone(&a, eps)
		seen += n
	}
	d.agentIdx = -1
	if d.err == nil && seen != total {
		d.fail(ErrInvalidField, "endpoints_total", totalAt, "announces "+strconv.Itoa(total)+" endpoints, agents hold "+strconv.Itoa(seen))
	}
	d.end()
	return d.err
}

// storedBuilder collects a Stored; all endpoints share one backing array.
type storedBuilder struct {
	s   Stored
	eps []EndpointState
}

func (sb *storedBuilder) begin(agents, endpoints int) {
	sb.s.Agents = make([]AgentState, 0, agents)
	sb.eps = make([]EndpointState, endpoints)
}

func (sb *storedBuilder) agent(_ *AgentState, n int) []EndpointState {
	eps := sb.eps[:n:n]
	sb.eps = sb.eps[n:]
	return eps
}

func (sb *storedBuilder) agentDone(a *AgentState, eps []EndpointState) {
	if len(eps) > 0 {
		a.Endpoints = eps
	}
	sb.s.Agents = append(sb.s.Agents, *a)
}

// DecodeStored parses and validates a stored snapshot. The result does not
// alias b. An empty b is not a snapshot: callers with nothing stored yet
// start from an empty Stored (MergeBytes does).
func DecodeStored(b []byte, lim Limits) (*Stored, error) {
	var sb storedBuilder
	if err := decodeStored(b, lim, &sb); err != nil {
		return nil, err
	}
	if len(sb.s.Agents) == 0 {
		sb.s.Agents = nil
	}
	return &sb.s, nil
}

// Merge returns a new Stored where push replaces its agent's previous
// endpoints, agents not heard from within lim.AgentTTL before now are
// dropped, and every other agent is kept as is. now is the receiver's clock.
//
// Times are judged on the receiver's clock. A push sent more than
// lim.MaxClockSkew after now is refused (ErrClockSkew). The stored scrape
// time of each endpoint is its age on the agent's clock (send time minus
// scrape time) counted back from now, and never later than now: whatever
// the agent's clock says, an endpoint is never fresher than the push that
// carried it, so it goes stale at most staleAfter after that push.
//
// It fails with ErrStaleSequence when push.Seq is not above the sequence
// last accepted from that agent (an expired agent's sequence is forgotten),
// ErrLimit when the result would exceed MaxAgents or MaxTotalEndpoints, and
// ErrInvalidField for an invalid push. stored is not modified; push's
// endpoints get the receiver-clock scrape times, and the result shares
// endpoint slices with stored and push.
func Merge(stored *Stored, push *Push, now time.Time, lim Limits) (*Stored, error) {
	lim = lim.resolved()
	if err := push.validate(&lim); err != nil {
		return nil, err
	}
	if _, err := timeNanos(now, "merge.now"); err != nil {
		return nil, err
	}
	if ahead := push.SendTime.Sub(now); ahead > lim.MaxClockSkew {
		return nil, errf(ErrClockSkew, "push.send_time", -1, "agent "+strconv.Quote(push.AgentID)+" sent at "+
			push.SendTime.UTC().Format(time.RFC3339Nano)+", "+ahead.String()+" ahead of the receiver's clock (limit "+
			lim.MaxClockSkew.String()+"): check the clocks of the agent's node and of this Envoy")
	}
	for i := range push.Endpoints {
		e := &push.Endpoints[i]
		age := push.SendTime.Sub(e.ScrapeTime)
		if age < 0 {
			age = 0
		}
		e.ScrapeTime = now.Add(-age)
		if !e.ScrapeTime.After(time.Unix(0, 0)) { // an absurd age: oldest time the format carries
			e.ScrapeTime = time.Unix(0, 1)
		}
	}
	var old []AgentState
	if stored != nil {
		old = stored.Agents
	}
	out := &Stored{Agents: make([]AgentState, 0, len(old)+1)}
	cutoff := now.Add(-lim.AgentTTL)
	inserted := false
	self := AgentState{AgentID: push.AgentID, LastSeq: push.Seq, Received: now, Endpoints: push.Endpoints}
	for i := range old {
		a := &old[i]
		c := strings.Compare(a.AgentID, push.AgentID)
		if c == 0 {
			// An expired agent is forgotten, sequence included: it is
			// a new agent now.
			if !a.Received.Before(cutoff) && push.Seq <= a.LastSeq {
				return nil, errf(ErrStaleSequence, "push.seq", -1,
					"agent "+strconv.Quote(push.AgentID)+" sent seq "+strconv.FormatUint(push.Seq, 10)+
						", last accepted "+strconv.FormatUint(a.LastSeq, 10))
			}
			continue
		}
		if c > 0 && !inserted {
			out.Agents = append(out.Agents, self)
			inserted = true
		}
		if a.Received.Before(cutoff) {
			continue
		}
		out.Agents = append(out.Agents, *a)
	}
	if !inserted {
		out.Agents = append(out.Agents, self)
	}
	if len(out.Agents) > lim.MaxAgents {
		return nil, errf(ErrLimit, "stored.agents", -1, "accepting agent "+strconv.Quote(push.AgentID)+" would keep "+
			strconv.Itoa(len(out.Agents))+" agents, limit "+strconv.Itoa(lim.MaxAgents))
	}
	if n := out.TotalEndpoints(); n > lim.MaxTotalEndpoints {
		return nil, errf(ErrLimit, "stored.endpoints", -1, "accepting agent "+strconv.Quote(push.AgentID)+" would keep "+
			strconv.Itoa(n)+" endpoints in total, limit "+strconv.Itoa(lim.MaxTotalEndpoints))
	}
	return out, nil
}

// MergeBytes is the receiver's whole write step: decode the push, decode
// what is stored (empty means nothing yet), Merge, encode. Nothing is
// returned on error, so the caller writes nothing. A stored value that
// cannot be decoded fails with an error wrapping both ErrStoredCorrupt and
// the decode error's kind.
func MergeBytes(stored, push []byte, now time.Time, lim Limits) ([]byte, error) {
	p, err := DecodePush(push, lim)
	if err != nil {
		return nil, err
	}
	s := &Stored{}
	if len(stored) > 0 {
		if s, err = DecodeStored(stored, lim); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrStoredCorrupt, err)
		}
	}
	merged, err := Merge(s, p, now, lim)
	if err != nil {
		return nil, err
	}
	return AppendStored(make([]byte, 0, len(stored)+len(push)), merged, lim)
}
