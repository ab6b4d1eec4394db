package githubsim

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// enterpriseRoute marks an enterprise runner route: GitHub documents these
// for GitHub Enterprise Cloud, and they need a classic token with
// manage_runners:enterprise (resolveScopeLocked).
func enterpriseRoute(rt *route) *route {
	rt.doc = strings.Replace(rt.doc, "https://docs.github.com/rest/", "https://docs.github.com/enterprise-cloud@latest/rest/", 1)
	return rt
}

// validateEnterprises checks Config.Enterprises: valid unique slugs over
// defined organizations (each in one enterprise at most), runner groups
// with unique ids above 1 and selected organizations of the enterprise.
func (c *Config) validateEnterprises() error {
	orgs := map[string]bool{}
	for _, o := range c.Organizations {
		orgs[strings.ToLower(o.Login)] = true
	}
	slugs, member := map[string]bool{}, map[string]string{}
	for _, e := range c.Enterprises {
		if !loginRE.MatchString(e.Slug) || slugs[strings.ToLower(e.Slug)] {
			return fmt.Errorf("enterprise slug %q is invalid or defined twice", e.Slug)
		}
		slugs[strings.ToLower(e.Slug)] = true
		mine := map[string]bool{}
		for _, l := range e.Organizations {
			k := strings.ToLower(l)
			if !orgs[k] {
				return fmt.Errorf("enterprise %s: organization %q is not one of organizations", e.Slug, l)
			}
			if other, ok := member[k]; ok {
				return fmt.Errorf("organization %s belongs to enterprises %s and %s", l, other, e.Slug)
			}
			member[k], mine[k] = e.Slug, true
		}
		ids := map[int64]bool{1: true}
		for _, g := range e.RunnerGroups {
			if g.ID <= 1 || ids[g.ID] || g.Name == "" || strings.EqualFold(g.Name, "Default") {
				return fmt.Errorf("enterprise %s: runner group %d %q: ids must be unique and > 1 (1 is Default), names non-empty", e.Slug, g.ID, g.Name)
			}
			ids[g.ID] = true
			switch g.Visibility {
			case "", "all", "selected":
			default:
				return fmt.Errorf("enterprise %s: runner group %q: visibility must be all or selected", e.Slug, g.Name)
			}
			for _, l := range g.SelectedOrganizations {
				if !mine[strings.ToLower(l)] {
					return fmt.Errorf("enterprise %s: runner group %q selects %q, which is not an organization of the enterprise", e.Slug, g.Name, l)
				}
			}
		}
	}
	return nil
}

// initEnterprises builds the enterprise accounts (after the organizations).
func (s *Simulator) initEnterprises(id func(int64) int64) {
	for _, e := range s.cfg.Enterprises {
		eo := &owner{login: e.Slug, id: id(e.ID), enterprise: true,
			groups: []*runnerGroup{{id: 1, name: "Default", visibility: "all", def: true}}}
		for _, l := range e.Organizations {
			eo.members = append(eo.members, s.owners[strings.ToLower(l)])
		}
		for _, g := range e.RunnerGroups {
			rg := &runnerGroup{id: g.ID, name: g.Name, visibility: g.Visibility, allowsPublic: g.AllowsPublicRepositories}
			if rg.visibility == "" {
				rg.visibility = "all"
			}
			for _, l := range g.SelectedOrganizations {
				rg.selected = append(rg.selected, s.owners[strings.ToLower(l)])
			}
			eo.groups = append(eo.groups, rg)
		}
		s.enterprises[strings.ToLower(e.Slug)] = eo
	}
}

// enterpriseOf is the enterprise an organization belongs to, or nil.
func (s *Simulator) enterpriseOf(o *owner) *owner {
	for _, e := range s.enterprises {
		for _, m := range e.members {
			if m == o {
				return e
			}
		}
	}
	return nil
}

// groupServes reports whether the enterprise's runner group g takes jobs
// of organization org: an organization of the enterprise that the group
// is visible to.
func (o *owner) groupServes(g *runnerGroup, org *owner) bool {
	member := false
	for _, m := range o.members {
		member = member || m == org
	}
	if !member || g == nil {
		return false
	}
	if g.visibility == "all" {
		return true
	}
	for _, sel := range g.selected {
		if sel == org {
			return true
		}
	}
	return false
}

// managesEnterpriseRunners reports whether the identity may use the
// enterprise runner endpoints: a classic token with
// manage_runners:enterprise or admin:enterprise. GitHub Apps cannot.
func (id *identity) managesEnterpriseRunners() bool {
	if id.kind != "pat" {
		return false
	}
	for _, sc := range id.pat.Scopes {
		if sc == "manage_runners:enterprise" || sc == "admin:enterprise" {
			return true
		}
	}
	return false
}

// enterpriseGroupJSON renders an enterprise runner group
// (runner-groups-enterprise).
func (s *Simulator) enterpriseGroupJSON(o *owner, g *runnerGroup) map[string]any {
	base := fmt.Sprintf("%s/enterprises/%s/actions/runner-groups/%d", s.apiBase(), o.login, g.id)
	out := map[string]any{
		"id":                              g.id,
		"name":                            g.name,
		"visibility":                      g.visibility,
		"default":                         g.def,
		"runners_url":                     base + "/runners",
		"allows_public_repositories":      g.allowsPublic,
		"restricted_to_workflows":         false,
		"selected_workflows":              []string{},
		"workflow_restrictions_read_only": false,
	}
	if g.visibility == "selected" {
		out["selected_organizations_url"] = base + "/organizations"
	}
	return out
}

// enterpriseJSON renders the enterprise object of webhook payloads.
func (s *Simulator) enterpriseJSON(e *owner) map[string]any {
	return map[string]any{
		"id":          e.id,
		"slug":        e.login,
		"name":        e.login,
		"node_id":     nodeID("Enterprise", e.id),
		"html_url":    s.htmlBase() + "/enterprises/" + e.login,
		"avatar_url":  fmt.Sprintf("https://avatars.githubusercontent.com/b/%d?v=4", e.id),
		"description": nil,
		"website_url": nil,
		"created_at":  "2024-01-01T00:00:00Z",
		"updated_at":  "2024-01-01T00:00:00Z",
	}
}

// handleListRunnerGroupOrgs is GET
// /enterprises/{enterprise}/actions/runner-groups/{runner_group_id}/organizations:
// the organizations a selected group serves (none listed for a group
// visible to all).
func (s *Simulator) handleListRunnerGroupOrgs(q *request) (int, any, error) {
	id, err := strconv.ParseInt(q.vars["runner_group_id"], 10, 64)
	g := q.owner.group(id)
	if err != nil || g == nil {
		return 0, nil, errNotFound()
	}
	start, end := q.paginate(len(g.selected))
	list := make([]any, 0, end-start)
	for _, o := range g.selected[start:end] {
		list = append(list, s.orgJSON(o))
	}
	return http.StatusOK, map[string]any{"total_count": len(g.selected), "organizations": list}, nil
}
