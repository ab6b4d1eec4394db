package workload

import "context"

// cleanupKey marks a call's context as a cleanup call.
type cleanupKey struct{}

// WithCleanup marks ctx's calls as cleanup (a runner's deregistration, a
// run's cancellation, a token's deletion): a provider's rate gate lets
// them spend the part of the platform's budget it keeps for cleanup
// (RateLimitError.Reserve), so that a busy spell of demand reads never
// keeps a VM's credential or runner alive.
func WithCleanup(ctx context.Context) context.Context {
	return context.WithValue(ctx, cleanupKey{}, true)
}

// IsCleanup reports whether ctx was marked by WithCleanup.
func IsCleanup(ctx context.Context) bool {
	v, _ := ctx.Value(cleanupKey{}).(bool)
	return v
}
