package scaleset

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
)

// Session is a message session of one scale set: while it lives, its
// holder alone receives the scale set's messages. Close deletes it.
type Session struct {
	c          *Client
	scaleSetID int

	mu   sync.Mutex
	info SessionInfo
}

// CreateSession opens the scale set's message session for owner (a name
// for the listener, shown by the service). It fails with
// ErrSessionConflict while another listener holds one; Listener retries.
func (c *Client) CreateSession(ctx context.Context, scaleSetID int, owner string) (*Session, error) {
	s := &Session{c: c, scaleSetID: scaleSetID}
	path := fmt.Sprintf("%s/%d/sessions", scaleSetsPath, scaleSetID)
	if err := c.serviceCall(ctx, http.MethodPost, path, nil, map[string]string{"ownerName": owner}, http.StatusOK, &s.info); err != nil {
		return nil, fmt.Errorf("create message session of scale set %d: %w", scaleSetID, err)
	}
	if s.info.SessionID == "" || s.info.MessageQueueURL == "" || s.info.MessageQueueAccessToken == "" {
		return nil, fmt.Errorf("create message session of scale set %d: the answer lacks session id, queue URL or token", scaleSetID)
	}
	if err := c.allowedHost("the session's messageQueueUrl", s.info.MessageQueueURL); err != nil {
		// The session is the service's all the same: give it back.
		s.info.MessageQueueAccessToken = ""
		if cerr := s.Close(ctx); cerr != nil {
			c.log.Info("could not delete the session whose queue URL was refused", "scaleSetID", scaleSetID, "error", cerr)
		}
		return nil, fmt.Errorf("create message session of scale set %d: %w", scaleSetID, err)
	}
	c.log.Info("message session created", "scaleSetID", scaleSetID, "sessionID", s.info.SessionID, "owner", owner)
	return s, nil
}

// Info is the session as last created or refreshed.
func (s *Session) Info() SessionInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info
}

// Refresh renews the message-queue token (PATCH of the session).
func (s *Session) Refresh(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refreshLocked(ctx)
}

func (s *Session) refreshLocked(ctx context.Context) error {
	var info SessionInfo
	path := fmt.Sprintf("%s/%d/sessions/%s", scaleSetsPath, s.scaleSetID, url.PathEscape(s.info.SessionID))
	if err := s.c.serviceCall(ctx, http.MethodPatch, path, nil, nil, http.StatusOK, &info); err != nil {
		return fmt.Errorf("refresh message session %s: %w", s.info.SessionID, err)
	}
	if info.MessageQueueAccessToken == "" {
		return fmt.Errorf("refresh message session %s: the answer has no token", s.info.SessionID)
	}
	if info.MessageQueueURL == "" {
		info.MessageQueueURL = s.info.MessageQueueURL
	} else if err := s.c.allowedHost("the refreshed session's messageQueueUrl", info.MessageQueueURL); err != nil {
		return fmt.Errorf("refresh message session %s: %w", s.info.SessionID, err)
	}
	s.info = info
	s.c.log.Info("message session refreshed", "scaleSetID", s.scaleSetID, "sessionID", info.SessionID)
	return nil
}

// Close deletes the session so another listener may take the scale set.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	path := fmt.Sprintf("%s/%d/sessions/%s", scaleSetsPath, s.scaleSetID, url.PathEscape(s.info.SessionID))
	if err := s.c.serviceCall(ctx, http.MethodDelete, path, nil, nil, http.StatusNoContent, nil); err != nil {
		return fmt.Errorf("delete message session %s: %w", s.info.SessionID, err)
	}
	s.c.log.Info("message session deleted", "scaleSetID", s.scaleSetID, "sessionID", s.info.SessionID)
	return nil
}

// withRefresh runs call and, when the message-queue token was refused,
// refreshes the session and runs it once more (ARC's behaviour).
func (s *Session) withRefresh(ctx context.Context, call func() error) error {
	err := call()
	if !errors.Is(err, ErrTokenExpired) {
		return err
	}
	s.c.log.Info("message queue token expired; refreshing the session", "scaleSetID", s.scaleSetID)
	if rerr := s.refreshLocked(ctx); rerr != nil {
		return errors.Join(err, rerr)
	}
	return call()
}

// queueURL is the message queue URL with extra query parameters (the
// queue URL carries its own, e.g. the session id).
func (s *Session) queueURL(suffix string, extra url.Values) (string, error) {
	u, err := url.Parse(s.info.MessageQueueURL)
	if err != nil {
		return "", fmt.Errorf("message queue URL: %w", err)
	}
	u.Path += suffix
	q := u.Query()
	for k, v := range extra {
		q[k] = v
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// GetMessage long-polls the queue for the next message after
// lastMessageID; nil when none came within the service's wait.
// maxCapacity is how many more runners the caller may start. A message
// stays queued until DeleteMessage acknowledges it.
func (s *Session) GetMessage(ctx context.Context, lastMessageID int64, maxCapacity int) (*Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var msg *Message
	err := s.withRefresh(ctx, func() error {
		extra := url.Values{}
		if lastMessageID > 0 {
			extra.Set("lastMessageId", strconv.FormatInt(lastMessageID, 10))
		}
		u, err := s.queueURL("", extra)
		if err != nil {
			return err
		}
		code, body, err := s.c.do(ctx, request{method: http.MethodGet, url: u, timeout: s.c.cfg.PollTimeout, header: http.Header{
			"Accept":          {"application/json; api-version=" + APIVersion},
			"Authorization":   {"Bearer " + s.info.MessageQueueAccessToken},
			HeaderMaxCapacity: {strconv.Itoa(max(maxCapacity, 0))}}})
		if err != nil {
			return fmt.Errorf("get message: %w", err)
		}
		switch code {
		case http.StatusAccepted, http.StatusNoContent:
			msg = nil
			return nil
		case http.StatusOK:
			m, err := DecodeMessage(body)
			if err != nil {
				return err
			}
			msg = m
			return nil
		}
		return fmt.Errorf("get message: %w", responseError(http.MethodGet, u, code, body))
	})
	return msg, err
}

// DeleteMessage acknowledges a message: it will not be delivered again.
func (s *Session) DeleteMessage(ctx context.Context, messageID int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.withRefresh(ctx, func() error {
		u, err := s.queueURL("/"+strconv.FormatInt(messageID, 10), nil)
		if err != nil {
			return err
		}
		_, err = s.c.expect(ctx, fmt.Sprintf("delete message %d", messageID), http.StatusNoContent, request{method: http.MethodDelete, url: u, header: http.Header{
			"Content-Type": {"application/json"}, "Authorization": {"Bearer " + s.info.MessageQueueAccessToken}}})
		return err
	})
}

// AcquireJobs claims offered job requests for the scale set and returns
// the ids it got (others went to another scale set or were cancelled).
func (s *Session) AcquireJobs(ctx context.Context, requestIDs []int64) ([]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	body, err := json.Marshal(requestIDs)
	if err != nil {
		return nil, fmt.Errorf("encode request ids: %w", err)
	}
	var got []int64
	err = s.withRefresh(ctx, func() error {
		s.c.mu.Lock()
		rerr := s.c.refreshLocked(ctx, false)
		base := s.c.serviceURL
		s.c.mu.Unlock()
		if rerr != nil {
			return rerr
		}
		u := fmt.Sprintf("%s%s/%d/acquirejobs?api-version=%s", base, scaleSetsPath, s.scaleSetID, APIVersion)
		// The message-queue token, not the admin token, authorises this.
		data, err := s.c.expect(ctx, "acquire jobs", http.StatusOK, request{method: http.MethodPost, url: u, body: body, header: http.Header{
			"Content-Type": {"application/json"}, "Authorization": {"Bearer " + s.info.MessageQueueAccessToken}}})
		if err != nil {
			return err
		}
		var out struct {
			Count int     `json:"count"`
			Value []int64 `json:"value"`
		}
		if err := json.Unmarshal(data, &out); err != nil {
			return fmt.Errorf("decode acquired jobs: %w", err)
		}
		got = out.Value
		return nil
	})
	return got, err
}
