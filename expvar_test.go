package shardwheel_test

import (
	"encoding/json"
	"expvar"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	sw "github.com/shardwheel/shardwheel"
)

// expvarSeq makes each test's expvar name unique: expvar's registry outlives a test, also
// across -count runs.
var expvarSeq atomic.Int64

func expvarName(t *testing.T) string {
	return fmt.Sprintf("shardwheel_%s_%d", t.Name(), expvarSeq.Add(1))
}

// readExpvar decodes the published variable as a Stats.
func readExpvar(t *testing.T, name string) sw.Stats {
	t.Helper()
	v := expvar.Get(name)
	require.NotNil(t, v, "expvar %q is not published", name)
	var st sw.Stats
	require.NoError(t, json.Unmarshal([]byte(v.String()), &st), "expvar %q: %s", name, v.String())
	return st
}

// TestStatsVar: each read is a fresh Stats; the JSON carries every counter and the lateness
// buckets; after Stop it reads the final counters.
func TestStatsVar(t *testing.T) {
	clk := sw.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	w, err := sw.New(sw.WithClock(clk), sw.WithWorkers(0), sw.WithShards(3))
	require.NoError(t, err)
	defer w.Stop()
	name := expvarName(t)
	expvar.Publish(name, w.StatsVar())

	require.Equal(t, sw.Stats{Shards: 3}, withoutHeld(readExpvar(t, name)))

	ran := 0
	for i := 0; i < 5; i++ {
		_, err := w.AfterFunc(time.Duration(i)*time.Millisecond, func() { ran++ })
		require.NoError(t, err)
	}
	tm, err := w.AfterFunc(time.Hour, func() { t.Error("a stopped timer ran") })
	require.NoError(t, err)
	require.True(t, tm.Stop())
	_, err = w.AfterFunc(time.Second, nil)
	require.ErrorIs(t, err, sw.ErrNilFunc)

	st := readExpvar(t, name)
	require.Equal(t, uint64(6), st.Scheduled)
	require.Equal(t, uint64(1), st.Stopped)
	require.Equal(t, uint64(1), st.Rejected)
	require.Equal(t, 5, st.Pending)
	require.Positive(t, st.HeldBytes)

	clk.Advance(10 * time.Millisecond)
	require.Equal(t, 5, ran)
	st = readExpvar(t, name)
	require.Equal(t, uint64(5), st.Fired)
	require.Equal(t, 0, st.Pending)
	require.Equal(t, st.Fired, st.Lateness.Count())
	require.Equal(t, w.Stats(), st)

	_, err = w.AfterFunc(time.Hour, func() { t.Error("ran after Stop") })
	require.NoError(t, err)
	require.Equal(t, 1, w.Stop())
	st = readExpvar(t, name)
	require.Equal(t, uint64(1), st.Dropped)
	require.Equal(t, st.Scheduled, st.Fired+st.Stopped+st.Dropped)
}

func withoutHeld(st sw.Stats) sw.Stats { st.HeldBytes = 0; return st }

// TestStatsVarDuplicateName: publishing a name twice panics in expvar.Publish, as for any expvar;
// one wheel may be published under several names.
func TestStatsVarDuplicateName(t *testing.T) {
	w, err := sw.New(sw.WithWorkers(1), sw.WithShards(1))
	require.NoError(t, err)
	defer w.Stop()
	name, other := expvarName(t), expvarName(t)
	expvar.Publish(name, w.StatsVar())
	require.Panics(t, func() { expvar.Publish(name, w.StatsVar()) })
	expvar.Publish(other, w.StatsVar())
	require.Equal(t, readExpvar(t, name), readExpvar(t, other))
}

// TestStatsVarDoesNotKeepWheel: expvar's registry lives for the process, yet a published
// wheel, stopped and dropped, is collected; its variable then reads null.
func TestStatsVarDoesNotKeepWheel(t *testing.T) {
	name := expvarName(t)
	func() {
		w, err := sw.New(sw.WithWorkers(1), sw.WithShards(1))
		require.NoError(t, err)
		expvar.Publish(name, w.StatsVar())
		w.Stop()
	}()
	v := expvar.Get(name)
	for i := 0; i < 100 && v.String() != "null"; i++ {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	require.Equal(t, "null", v.String())
}
