package workload

import (
	"context"
	"errors"
	"time"
)

// A job feed is a platform's push channel of job events that the operator
// holds open itself, outbound, instead of (or besides) receiving webhooks:
// GitHub's runner scale sets, whose message queue a listener long-polls.
// The operator's leader runs one listener per pool that names a feed
// (internal/feeds); what it hears becomes the pool's demand records like a
// webhook's events (internal/demand), and the pool's VMs register as the
// feed's runners (RunnerSpec.Feed), since a platform gives a feed's jobs
// only to the feed's own runners.

// FeedSpec is the feed a pool listens to, in the platform's terms.
type FeedSpec struct {
	// Name names the feed in its scope (a scale set's name).
	Name string
	// Group is the runner group the feed's runners join; empty for the
	// scope's default group.
	Group string
	// Labels are all the feed's runners' labels (RunnerLabels): the feed
	// is offered the jobs they cover.
	Labels []string
}

// FeedProvider is implemented by Providers whose platform offers job
// feeds.
type FeedProvider interface {
	// OpenFeed creates the feed of spec in the provider's scope, or adopts
	// the one of that name, and brings its labels to spec's. An error
	// wrapping ErrInvalidRequest, ErrNotFound or ErrUnauthorized is the
	// user's to fix (an unknown group, a name taken in another group,
	// credentials that may not manage runners).
	OpenFeed(ctx context.Context, spec FeedSpec) (Feed, error)
}

// Feed is one opened job feed.
type Feed interface {
	// ID is the platform's id of the feed, for status and logs.
	ID() int64
	// Listen holds the feed's session until ctx ends, then gives it back
	// and returns ctx's error; it returns earlier on a failure it cannot
	// ride out (ErrFeedConflict while another listener keeps the session
	// past the platform's wait). owner names the listener to the platform.
	// capacity is asked before each wait for events: how many runners the
	// pool may have at most, which the platform sizes its offers by. Each
	// event is passed to handle in order; an error from handle stops
	// Listen. Jobs the feed offers are taken for the feed's runners before
	// Listen moves on.
	Listen(ctx context.Context, owner string, capacity func() int, handle func(context.Context, FeedEvent) error) error
}

// FeedEvent is one thing a feed reported: a job's progress, or the feed's
// counts (Statistics alone).
type FeedEvent struct {
	// Job is the job in the platform's REST terms (its ID is the id
	// webhooks carry, so that demand from both sources meets in one
	// record), with State queued, in_progress or completed; zero for a
	// statistics-only event.
	Job Job
	// Statistics are the feed's counts when the event was sent; nil when
	// the platform sent none.
	Statistics *FeedStatistics
	// At is when the listener received the event.
	At time.Time
	// Unresolved, when set, says why the platform's job message could not
	// be turned into Job (its job not found through the platform's API in
	// time); Job is zero then. The job is the feed's all the same, and
	// the pool's resync finds it.
	Unresolved error
}

// FeedStatistics are a feed's counts as the platform reports them.
type FeedStatistics struct {
	// Assigned are jobs given to the feed and waiting for or running on
	// its runners; Running the ones running.
	Assigned, Running int
	// Runners are the feed's registered runners.
	Runners int
}

// ErrFeedConflict: another listener holds the feed's session and did not
// give it up in time.
var ErrFeedConflict = errors.New("another listener holds the job feed's session")
