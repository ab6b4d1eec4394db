package gitlabsim

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The tables below are facts from GitLab's published API description,
// doc/api/openapi/openapi_v2.yaml in GitLab's repository, at commit
// 0338625c4996c8b4dde44bd86d1767b654121ee7 (GitLab's development branch:
// it names features introduced in 18.9; the file is generated from the
// Grape API by `rake gitlab:openapi:v2:generate`). CI cannot fetch that
// file (it has no internet, and the file is on neither npm nor the Go
// module proxy), and this project keeps no copy of another project's
// files, so they were transcribed by hand, by reading the description: for
// every endpoint the simulator serves that the description documents, the
// method, the path template, the documented status codes and parameters
// and, for the response entity, each property's name and documented type.
// Nothing else of the description is here.
//
// The description types many properties loosely: grape-swagger writes
// "string" for every property whose entity declares no type (GitLab's
// integer ids of groups, the booleans and arrays of RunnerDetails, ...),
// and a bare $ref where GitLab answers an array of the entity. Such a
// property keeps its documented type in the table and says, in its second
// type, what GitLab sends (from GitLab's API documentation and client-go's
// types); the check uses that type for it and the documented one for every
// other property.
//
// The description does not document:
//   - GET /user (of lib/api/users.rb's routes only POST /user/runners is
//     in it): client-go's User type is what rest_test.go checks it
//     against;
//   - any response entity of the runner API (POST /runners/verify, POST
//     /jobs/request, PUT /jobs/:id, PATCH /jobs/:id/trace, DELETE /runners,
//     DELETE /runners/managers): only their status codes and request
//     parameters are documented, and checked here; their bodies are checked
//     against gitlab-runner's own types (runnerapi_test.go, and
//     runnertypes_test.go, which reads those types from gitlab-runner's
//     source).

const (
	descriptionPath   = "doc/api/openapi/openapi_v2.yaml"
	descriptionCommit = "0338625c4996c8b4dde44bd86d1767b654121ee7"
)

// prop is one documented property of an entity. Types are the
// description's words: string, integer, number, boolean, array, object;
// "$Entity" is a $ref to another entity, "[]$Entity" an array of it.
type prop struct {
	name string
	doc  string // the type the description documents
	sent string // where the description types it loosely: the type GitLab sends, checked instead of doc
	null bool   // GitLab sends null while the property is unset
}

func f(name, doc string) prop         { return prop{name: name, doc: doc} }
func fn(name, doc string) prop        { return prop{name: name, doc: doc, null: true} }
func fl(name, doc, sent string) prop  { return prop{name: name, doc: doc, sent: sent} }
func fln(name, doc, sent string) prop { return prop{name: name, doc: doc, sent: sent, null: true} }
func concat(lists ...[]prop) []prop   { return slices.Concat(lists...) }
func reasons(r string, names ...string) map[string]string {
	m := map[string]string{}
	for _, n := range names {
		m[n] = r
	}
	return m
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// entity is a documented response entity. absent lists the documented
// properties the simulator leaves out, with why: GitLab itself sends them
// only in some answers, or they describe what the simulator does not
// model. Every other documented property must be in the simulator's
// answer, and nothing else may be.
type entity struct {
	props  []prop
	absent map[string]string
}

// Reasons shared by several entities.
const (
	whyCustomAttributes = "GitLab sends custom attributes only with with_custom_attributes=true, to administrators; the simulator has none"
	whyStatistics       = "GitLab sends statistics only with statistics=true; the simulator models no storage"
	whyEE               = "a GitLab EE (Premium/Ultimate) feature's setting, exposed where the license has the feature; the simulator answers as GitLab Free"
	whyRegistrationTok  = "a runner registration token (deprecated since GitLab 15.6), which the simulator does not model (runners are created with POST /user/runners)"
	whyRegistry         = "container registry settings; the simulated instance has no container registry"
	whyAdminStorage     = "GitLab shows the storage shard to administrators only (change_repository_storage); the simulator models no storage"
)

var userBasicProps = []prop{
	f("id", "integer"), f("username", "string"), f("public_email", "string"), f("name", "string"),
	f("state", "string"), f("locked", "boolean"), fn("avatar_url", "string"), f("avatar_path", "string"),
	f("custom_attributes", "array"), f("web_url", "string"),
}

var userBasicAbsent = map[string]string{
	"avatar_path":       "GitLab sends the avatar's path only for an uploaded avatar; the simulator's users have none",
	"custom_attributes": whyCustomAttributes,
}

var basicProjectProps = []prop{
	f("id", "integer"), f("description", "string"), f("name", "string"), f("name_with_namespace", "string"),
	f("path", "string"), f("path_with_namespace", "string"), f("created_at", "string"), f("default_branch", "string"),
	f("tag_list", "array"), f("topics", "array"), f("ssh_url_to_repo", "string"), f("http_url_to_repo", "string"),
	f("web_url", "string"), fn("readme_url", "string"), f("forks_count", "integer"), f("license_url", "string"),
	f("license", "$API_Entities_LicenseBasic"), fn("avatar_url", "string"), f("star_count", "integer"),
	f("last_activity_at", "string"), f("visibility", "string"), f("namespace", "$API_Entities_NamespaceBasic"),
	fl("custom_attributes", "$API_Entities_CustomAttribute", "array"), f("repository_storage", "string"),
}

var basicProjectAbsent = merge(
	reasons("GitLab sends the license only with license=true; the simulator serves no repository", "license_url", "license"),
	reasons(whyCustomAttributes, "custom_attributes"),
	reasons(whyAdminStorage, "repository_storage"),
)

// projectProps are API_Entities_Project's own properties, after those of
// BasicProjectDetails, which the description repeats first.
var projectProps = []prop{
	f("forked_from_project", "$API_Entities_BasicProjectDetails"), f("container_registry_image_prefix", "string"), f("_links", "$API_Entities_Project._links"),
	fn("marked_for_deletion_at", "string"), fn("marked_for_deletion_on", "string"), f("packages_enabled", "boolean"),
	f("empty_repo", "boolean"), f("archived", "boolean"), f("owner", "$API_Entities_UserBasic"),
	f("resolve_outdated_diff_discussions", "boolean"), f("container_expiration_policy", "$API_Entities_ContainerExpirationPolicy"),
	f("repository_object_format", "string"), f("issues_enabled", "boolean"), f("merge_requests_enabled", "boolean"),
	f("wiki_enabled", "boolean"), f("jobs_enabled", "boolean"), f("snippets_enabled", "boolean"),
	f("container_registry_enabled", "boolean"), f("service_desk_enabled", "boolean"), fn("service_desk_address", "string"),
	f("can_create_merge_request_in", "boolean"), f("issues_access_level", "string"), f("repository_access_level", "string"),
	f("merge_requests_access_level", "string"), f("forking_access_level", "string"), f("wiki_access_level", "string"),
	f("builds_access_level", "string"), f("snippets_access_level", "string"), f("pages_access_level", "string"),
	f("analytics_access_level", "string"), f("container_registry_access_level", "string"),
	f("security_and_compliance_access_level", "string"), f("releases_access_level", "string"),
	f("environments_access_level", "string"), f("feature_flags_access_level", "string"),
	f("infrastructure_access_level", "string"), f("monitor_access_level", "string"),
	f("model_experiments_access_level", "string"), f("model_registry_access_level", "string"),
	f("package_registry_access_level", "string"), f("emails_disabled", "boolean"), f("emails_enabled", "boolean"),
	f("show_diff_preview_in_email", "boolean"), f("shared_runners_enabled", "boolean"), f("lfs_enabled", "boolean"),
	f("creator_id", "integer"), f("mr_default_target_self", "boolean"), fn("import_url", "string"),
	fn("import_type", "string"), f("import_status", "string"), fn("import_error", "string"),
	f("open_issues_count", "integer"), f("description_html", "string"), f("updated_at", "string"),
	f("ci_default_git_depth", "integer"), fn("ci_delete_pipelines_in_seconds", "integer"),
	f("ci_forward_deployment_enabled", "boolean"), f("ci_forward_deployment_rollback_allowed", "boolean"),
	f("ci_job_token_scope_enabled", "boolean"), f("ci_separated_caches", "boolean"),
	f("ci_allow_fork_pipelines_to_run_in_parent_project", "boolean"), f("ci_id_token_sub_claim_components", "array"),
	f("build_git_strategy", "string"), f("keep_latest_artifact", "boolean"), f("restrict_user_defined_variables", "boolean"),
	f("ci_pipeline_variables_minimum_override_role", "string"), fn("runner_token_expiration_interval", "integer"),
	f("group_runners_enabled", "boolean"), f("resource_group_default_process_mode", "string"),
	f("auto_cancel_pending_pipelines", "string"), f("build_timeout", "integer"), f("auto_devops_enabled", "boolean"),
	f("auto_devops_deploy_strategy", "string"), f("ci_push_repository_for_job_token_allowed", "boolean"),
	f("runners_token", "string"), fn("ci_config_path", "string"), f("public_jobs", "boolean"),
	f("shared_with_groups", "array"), f("only_allow_merge_if_pipeline_succeeds", "boolean"),
	f("allow_merge_on_skipped_pipeline", "boolean"), f("request_access_enabled", "boolean"),
	f("only_allow_merge_if_all_discussions_are_resolved", "boolean"), f("remove_source_branch_after_merge", "boolean"),
	f("printing_merge_request_link_enabled", "boolean"), f("merge_method", "string"),
	fn("merge_request_title_regex", "string"), fn("merge_request_title_regex_description", "string"),
	f("squash_option", "string"), f("enforce_auth_checks_on_uploads", "boolean"), fn("suggestion_commit_message", "string"),
	fn("merge_commit_template", "string"), fn("squash_commit_template", "string"), fn("issue_branch_template", "string"),
	f("statistics", "$API_Entities_ProjectStatistics"), f("warn_about_potentially_unwanted_characters", "boolean"),
	f("autoclose_referenced_issues", "boolean"), fn("max_artifacts_size", "integer"),
	f("approvals_before_merge", "string"), f("mirror", "string"), f("mirror_user_id", "string"),
	f("mirror_trigger_builds", "string"), f("only_mirror_protected_branches", "string"),
	f("mirror_overwrites_diverged_branches", "string"), f("external_authorization_classification_label", "string"),
	f("requirements_enabled", "string"), f("requirements_access_level", "string"),
	f("security_and_compliance_enabled", "string"), f("secret_push_protection_enabled", "boolean"),
	f("pre_receive_secret_detection_enabled", "boolean"), f("compliance_frameworks", "string"),
	f("issues_template", "string"), f("merge_requests_template", "string"),
	f("ci_restrict_pipeline_cancellation_role", "string"), f("merge_pipelines_enabled", "string"),
	f("merge_trains_enabled", "string"), f("merge_trains_skip_train_allowed", "string"),
	f("only_allow_merge_if_all_status_checks_passed", "string"), f("allow_pipeline_trigger_approve_deployment", "boolean"),
	f("prevent_merge_without_jira_issue", "string"), f("auto_duo_code_review_enabled", "string"),
	f("duo_remote_flows_enabled", "string"), f("duo_foundational_flows_enabled", "string"),
	f("duo_sast_fp_detection_enabled", "string"), f("web_based_commit_signing_enabled", "string"),
	f("spp_repository_pipeline_access", "boolean"),
}

var projectAbsent = merge(basicProjectAbsent,
	reasons(whyRegistry, "container_registry_image_prefix", "container_expiration_policy"),
	reasons("GitLab sends the owner only for a project in a user's namespace, which the simulator does not model", "owner"),
	reasons("GitLab sends it for forks only; the simulator models no forks", "forked_from_project", "mr_default_target_self"),
	reasons(whyRegistrationTok, "runners_token"),
	reasons(whyStatistics, "statistics"),
	reasons(whyEE, "approvals_before_merge", "mirror", "mirror_user_id", "mirror_trigger_builds",
		"only_mirror_protected_branches", "mirror_overwrites_diverged_branches",
		"external_authorization_classification_label", "requirements_enabled", "requirements_access_level",
		"security_and_compliance_enabled", "secret_push_protection_enabled", "pre_receive_secret_detection_enabled",
		"compliance_frameworks", "issues_template", "merge_requests_template", "ci_restrict_pipeline_cancellation_role",
		"merge_pipelines_enabled", "merge_trains_enabled", "merge_trains_skip_train_allowed",
		"only_allow_merge_if_all_status_checks_passed", "allow_pipeline_trigger_approve_deployment",
		"prevent_merge_without_jira_issue", "auto_duo_code_review_enabled", "duo_remote_flows_enabled",
		"duo_foundational_flows_enabled", "duo_sast_fp_detection_enabled", "web_based_commit_signing_enabled",
		"spp_repository_pipeline_access"),
)

// whyAdminFields: GitLab's Project entity shows these only when one
// project is read (GET /projects/:id) by a user who may administer it
// (user_can_admin_project); lists leave them out.
const whyAdminFields = "GitLab sends it only on GET /projects/:id to a user who may administer the project (user_can_admin_project), not in lists"

var listedProjectAbsent = reasons(whyAdminFields, "API_Entities_Project.import_url", "API_Entities_Project.import_error", "API_Entities_Project.build_git_strategy")

var ciRunnerProps = []prop{
	f("id", "integer"), f("description", "string"), f("ip_address", "string"), f("active", "boolean"),
	f("paused", "boolean"), f("is_shared", "boolean"), f("runner_type", "string"), f("name", "string"),
	f("online", "boolean"), f("created_by", "$API_Entities_UserBasic"), f("created_at", "string"),
	f("status", "string"), f("job_execution_status", "string"),
}

var pipelineBasicProps = []prop{
	f("id", "integer"), f("iid", "integer"), f("project_id", "integer"), f("sha", "string"), f("ref", "string"),
	f("status", "string"), f("source", "string"), f("created_at", "string"), f("updated_at", "string"), f("web_url", "string"),
}

var descEntities = map[string]entity{
	"API_Entities_UserBasic": {props: userBasicProps, absent: userBasicAbsent},
	// API_Entities_User repeats UserBasic's properties first.
	"API_Entities_User": {props: concat(userBasicProps, []prop{
		f("created_at", "string"), f("bio", "string"), f("location", "string"), f("linkedin", "string"),
		f("twitter", "string"), f("discord", "string"), f("website_url", "string"), f("github", "string"),
		f("job_title", "string"), fn("pronouns", "string"), f("organization", "string"),
		fl("bot", "string", "boolean"), fn("work_information", "string"), fl("followers", "string", "integer"),
		fl("following", "string", "integer"), fl("is_followed", "string", "boolean"), fn("local_time", "string"),
	}), absent: userBasicAbsent},
	"API_Entities_NamespaceBasic": {props: []prop{
		f("id", "integer"), f("name", "string"), f("path", "string"), f("kind", "string"), f("full_path", "string"),
		fn("parent_id", "integer"), fn("avatar_url", "string"), f("web_url", "string"),
	}},
	"API_Entities_BasicProjectDetails": {props: basicProjectProps, absent: basicProjectAbsent},
	"API_Entities_Project":             {props: concat(basicProjectProps, projectProps), absent: projectAbsent},
	// API_Entities_ProjectWithAccess repeats API_Entities_Project's
	// properties and adds permissions.
	"API_Entities_ProjectWithAccess": {props: concat(basicProjectProps, projectProps, []prop{
		f("permissions", "$API_Entities_ProjectWithAccess.permissions"),
	}), absent: projectAbsent},
	// Inline objects of the description, named here by where they are.
	"API_Entities_Project._links": {props: []prop{
		f("self", "string"), f("issues", "string"), f("merge_requests", "string"), f("repo_branches", "string"),
		f("labels", "string"), f("events", "string"), f("members", "string"), f("cluster_agents", "string"),
	}},
	"API_Entities_ProjectWithAccess.permissions": {props: []prop{
		fn("project_access", "$API_Entities_ProjectAccess"), fn("group_access", "$API_Entities_GroupAccess"),
	}},
	"API_Entities_ProjectAccess": {props: []prop{fl("access_level", "string", "integer"), fl("notification_level", "string", "integer")}},
	"API_Entities_GroupAccess":   {props: []prop{fl("access_level", "string", "integer"), fl("notification_level", "string", "integer")}},
	"API_Entities_GroupDetail": {props: []prop{
		fl("id", "string", "integer"), f("web_url", "string"), f("name", "string"), f("path", "string"),
		f("description", "string"), f("visibility", "string"), fl("share_with_group_lock", "string", "boolean"),
		fl("require_two_factor_authentication", "string", "boolean"), fl("two_factor_grace_period", "string", "integer"),
		f("project_creation_level", "string"), fln("auto_devops_enabled", "string", "boolean"),
		f("subgroup_creation_level", "string"), f("emails_disabled", "boolean"), f("emails_enabled", "boolean"),
		f("show_diff_preview_in_email", "boolean"), fln("mentions_disabled", "string", "boolean"),
		fl("lfs_enabled", "string", "boolean"), f("archived", "boolean"), f("math_rendering_limits_enabled", "boolean"),
		f("lock_math_rendering_limits_enabled", "boolean"), fn("default_branch", "string"),
		fl("default_branch_protection", "string", "integer"), fl("default_branch_protection_defaults", "string", "object"),
		fn("avatar_url", "string"), fl("request_access_enabled", "string", "boolean"), f("full_name", "string"),
		f("full_path", "string"), f("created_at", "string"), fln("parent_id", "string", "integer"),
		fl("organization_id", "string", "integer"), f("shared_runners_setting", "string"), fn("max_artifacts_size", "integer"),
		f("custom_attributes", "$API_Entities_CustomAttribute"), f("statistics", "object"), fn("marked_for_deletion_on", "string"),
		f("root_storage_statistics", "$API_Entities_Namespace_RootStorageStatistics"), f("ldap_cn", "string"),
		f("ldap_access", "string"), f("ldap_group_links", "$API_Entities_LdapGroupLink"),
		f("saml_group_links", "$API_Entities_SamlGroupLink"), f("file_template_project_id", "string"),
		f("wiki_access_level", "string"), f("repository_storage", "string"), f("duo_core_features_enabled", "boolean"),
		f("duo_features_enabled", "string"), f("lock_duo_features_enabled", "string"), f("auto_duo_code_review_enabled", "string"),
		f("web_based_commit_signing_enabled", "string"), f("allow_personal_snippets", "string"),
		f("duo_namespace_access_rules", "string"), fl("shared_with_groups", "string", "array"), f("runners_token", "string"),
		f("enabled_git_access_protocol", "string"), fl("prevent_sharing_groups_outside_hierarchy", "string", "boolean"),
		f("step_up_auth_required_oauth_provider", "string"), fl("projects", "$API_Entities_Project", "[]$API_Entities_Project"),
		fl("shared_projects", "$API_Entities_Project", "[]$API_Entities_Project"), f("shared_runners_minutes_limit", "string"),
		f("extra_shared_runners_minutes_limit", "string"), f("prevent_forking_outside_group", "string"),
		f("service_access_tokens_expiration_enforced", "string"), f("membership_lock", "string"),
		f("ip_restriction_ranges", "string"), f("allowed_email_domains_list", "string"),
		f("only_allow_merge_if_pipeline_succeeds", "string"), f("allow_merge_on_skipped_pipeline", "string"),
		f("only_allow_merge_if_all_discussions_are_resolved", "string"), f("unique_project_download_limit", "string"),
		f("unique_project_download_limit_interval_in_seconds", "string"), f("unique_project_download_limit_allowlist", "string"),
		f("unique_project_download_limit_alertlist", "string"), f("auto_ban_user_on_excessive_projects_download", "string"),
	}, absent: merge(
		reasons(whyCustomAttributes, "custom_attributes"),
		reasons(whyStatistics, "statistics", "root_storage_statistics"),
		reasons(whyAdminStorage, "repository_storage"),
		reasons(whyRegistrationTok, "runners_token"),
		reasons("LDAP and SAML group links (GitLab EE, with LDAP or SAML configured); the simulator models neither",
			"ldap_cn", "ldap_access", "ldap_group_links", "saml_group_links"),
		reasons(whyEE, "file_template_project_id", "wiki_access_level", "duo_core_features_enabled", "duo_features_enabled",
			"lock_duo_features_enabled", "auto_duo_code_review_enabled", "web_based_commit_signing_enabled",
			"allow_personal_snippets", "duo_namespace_access_rules", "enabled_git_access_protocol",
			"step_up_auth_required_oauth_provider", "shared_runners_minutes_limit", "extra_shared_runners_minutes_limit",
			"prevent_forking_outside_group", "service_access_tokens_expiration_enforced", "membership_lock",
			"ip_restriction_ranges", "allowed_email_domains_list", "only_allow_merge_if_pipeline_succeeds",
			"allow_merge_on_skipped_pipeline", "only_allow_merge_if_all_discussions_are_resolved",
			"unique_project_download_limit", "unique_project_download_limit_interval_in_seconds",
			"unique_project_download_limit_allowlist", "unique_project_download_limit_alertlist",
			"auto_ban_user_on_excessive_projects_download"),
	)},
	"API_Entities_BasicGroupDetails": {props: []prop{fl("id", "string", "integer"), f("web_url", "string"), f("name", "string")}},
	"API_Entities_Ci_Runner":         {props: ciRunnerProps},
	// API_Entities_Ci_RunnerDetails repeats API_Entities_Ci_Runner's
	// properties first.
	"API_Entities_Ci_RunnerDetails": {props: concat(ciRunnerProps, []prop{
		fl("tag_list", "string", "array"), fl("run_untagged", "string", "boolean"), fl("locked", "string", "boolean"),
		fln("maximum_timeout", "string", "integer"), f("access_level", "string"), fn("version", "string"),
		fn("revision", "string"), fn("platform", "string"), fn("architecture", "string"), fn("contacted_at", "string"),
		f("maintenance_note", "string"),
		fl("projects", "$API_Entities_BasicProjectDetails", "[]$API_Entities_BasicProjectDetails"),
		fl("groups", "$API_Entities_BasicGroupDetails", "[]$API_Entities_BasicGroupDetails"),
	})},
	"API_Entities_Ci_RunnerRegistrationDetails": {props: []prop{
		fl("id", "string", "integer"), f("token", "string"), fn("token_expires_at", "string"),
	}},
	"API_Entities_PersonalAccessTokenWithLastUsedIps": {props: []prop{
		f("id", "integer"), f("name", "string"), f("revoked", "boolean"), f("created_at", "string"),
		f("description", "string"), f("scopes", "array"), f("user_id", "integer"), fn("last_used_at", "string"),
		f("active", "boolean"), fn("expires_at", "string"), f("last_used_ips", "array"),
	}},
	"API_Entities_Ci_Job": {props: []prop{
		f("id", "integer"), f("status", "string"), f("stage", "string"), f("name", "string"), f("ref", "string"),
		f("tag", "boolean"), fn("coverage", "number"), f("allow_failure", "boolean"), f("created_at", "string"),
		fn("started_at", "string"), fn("finished_at", "string"), fn("erased_at", "string"), fn("duration", "number"),
		fn("queued_duration", "number"), f("user", "$API_Entities_User"), f("commit", "$API_Entities_Commit"),
		f("pipeline", "$API_Entities_Ci_PipelineBasic"), f("failure_reason", "string"), f("web_url", "string"),
		f("project", "$API_Entities_Ci_Job.project"), f("artifacts_file", "$API_Entities_Ci_JobArtifactFile"),
		f("artifacts", "[]$API_Entities_Ci_JobArtifact"), fn("runner", "$API_Entities_Ci_Runner"),
		f("runner_manager", "$API_Entities_Ci_RunnerManager"), fn("artifacts_expire_at", "string"),
		f("archived", "boolean"), f("tag_list", "array"),
	}, absent: map[string]string{
		"failure_reason": "GitLab sends it for failed jobs only",
		"artifacts_file": "GitLab sends it only for a job with an artifacts archive; the simulator models no artifacts",
		"runner_manager": "the simulator does not record which of a runner's managers (system_id) ran a job",
	}},
	"API_Entities_Ci_Job.project":   {props: []prop{fl("ci_job_token_scope_enabled", "string", "boolean")}},
	"API_Entities_Ci_PipelineBasic": {props: pipelineBasicProps},
	"API_Entities_Commit": {props: []prop{
		f("id", "string"), f("short_id", "string"), f("created_at", "string"), f("parent_ids", "array"),
		f("title", "string"), f("message", "string"), f("author_name", "string"), f("author_email", "string"),
		f("authored_date", "string"), f("committer_name", "string"), f("committer_email", "string"),
		f("committed_date", "string"), f("trailers", "object"), f("extended_trailers", "object"), f("web_url", "string"),
	}},
	// API_Entities_Ci_Pipeline repeats PipelineBasic's properties first.
	"API_Entities_Ci_Pipeline": {props: concat(pipelineBasicProps, []prop{
		f("before_sha", "string"), f("tag", "boolean"), fn("yaml_errors", "string"), f("user", "$API_Entities_UserBasic"),
		fn("started_at", "string"), fn("finished_at", "string"), fn("committed_at", "string"), fn("duration", "integer"),
		fn("queued_duration", "integer"), fn("coverage", "number"), f("detailed_status", "$DetailedStatusEntity"),
		f("archived", "boolean"),
	})},
	"DetailedStatusEntity": {props: []prop{
		f("icon", "string"), f("text", "string"), f("label", "string"), f("group", "string"), f("tooltip", "string"),
		f("has_details", "boolean"), f("details_path", "string"), fn("illustration", "object"), f("favicon", "string"),
		f("action", "object"),
	}, absent: map[string]string{"action": "GitLab sends it only for a status with an action (has_action?); the simulator's have none"}},
	// Referenced entities the simulator never sends (the properties that
	// hold them are absent with a reason above), listed so that every $ref
	// resolves; their properties are not transcribed, so an answer that
	// held one would fail until they are.
	"API_Entities_LicenseBasic":                    {},
	"API_Entities_CustomAttribute":                 {},
	"API_Entities_ContainerExpirationPolicy":       {},
	"API_Entities_ProjectStatistics":               {},
	"API_Entities_Namespace_RootStorageStatistics": {},
	"API_Entities_LdapGroupLink":                   {},
	"API_Entities_SamlGroupLink":                   {},
	"API_Entities_Ci_JobArtifactFile":              {},
	"API_Entities_Ci_RunnerManager":                {},
	"API_Entities_Ci_JobArtifact": {props: []prop{
		f("file_type", "string"), f("size", "integer"), f("filename", "string"), f("file_format", "string"),
	}},
}

// endpoint is one documented operation the simulator serves.
type endpoint struct {
	success []int    // the success status codes the description documents
	errors  []int    // its documented error codes (the ones this test provokes must be among them)
	schema  string   // the documented success entity ("" when none is documented)
	sent    string   // where the description gives the bare entity for a list: what GitLab answers
	params  []string // the documented body and query parameters (nested ones as "info.name")
	// absent lists, as "Entity.property", what this endpoint's answers
	// leave out beyond the entities' own absent sets, with why.
	absent map[string]string
}

var listRunnerParams = []string{"scope", "type", "paused", "status", "tag_list", "version_prefix", "page", "per_page"}

// descEndpoints is keyed by method and path template, as the description
// writes them.
var descEndpoints = map[string]endpoint{
	"POST /api/v4/user/runners": {success: []int{201}, errors: []int{400, 403}, schema: "$API_Entities_Ci_RunnerRegistrationDetails",
		params: []string{"runner_type", "group_id", "project_id", "description", "maintenance_note", "paused", "locked",
			"access_level", "run_untagged", "tag_list", "maximum_timeout"}},
	"GET /api/v4/runners/all": {success: []int{200}, errors: []int{400, 401}, schema: "$API_Entities_Ci_Runner",
		sent: "[]$API_Entities_Ci_Runner", params: listRunnerParams},
	"GET /api/v4/runners/{id}": {success: []int{200}, errors: []int{401, 403, 404}, schema: "$API_Entities_Ci_RunnerDetails",
		params: []string{"include_projects"}},
	"PUT /api/v4/runners/{id}": {success: []int{200}, errors: []int{400, 401, 403, 404}, schema: "$API_Entities_Ci_RunnerDetails",
		params: []string{"description", "active", "paused", "tag_list", "run_untagged", "locked", "access_level",
			"maximum_timeout", "maintenance_note"}},
	// The description attaches API_Entities_Ci_Runner to the 204, which
	// has no body.
	"DELETE /api/v4/runners/{id}": {success: []int{204}, errors: []int{401, 403, 404, 412}},
	"GET /api/v4/projects/{id}/runners": {success: []int{200}, errors: []int{400, 403}, schema: "$API_Entities_Ci_Runner",
		sent: "[]$API_Entities_Ci_Runner", params: listRunnerParams},
	"GET /api/v4/groups/{id}/runners": {success: []int{200}, errors: []int{400, 403}, schema: "$API_Entities_Ci_Runner",
		sent: "[]$API_Entities_Ci_Runner", params: []string{"type", "paused", "status", "tag_list", "version_prefix", "page", "per_page"}},
	"GET /api/v4/projects/{id}": {success: []int{200}, schema: "$API_Entities_ProjectWithAccess",
		absent: reasons("GitLab sends it only to a user who may administer the project (user_can_admin_project); this test also reads the project as a Developer",
			"API_Entities_ProjectWithAccess.import_url", "API_Entities_ProjectWithAccess.import_error", "API_Entities_ProjectWithAccess.build_git_strategy")},
	"GET /api/v4/groups/{id}": {success: []int{200}, schema: "$API_Entities_GroupDetail",
		params: []string{"with_custom_attributes", "with_projects"}, absent: listedProjectAbsent},
	"GET /api/v4/groups/{id}/projects": {success: []int{200}, schema: "[]$API_Entities_Project",
		params: []string{"active", "archived", "visibility", "search", "order_by", "sort", "simple", "owned", "starred",
			"with_issues_enabled", "with_merge_requests_enabled", "with_shared", "include_subgroups", "include_ancestor_groups",
			"min_access_level", "page", "per_page", "with_custom_attributes", "with_security_reports"},
		absent: listedProjectAbsent},
	"GET /api/v4/projects/{id}/jobs": {success: []int{200}, errors: []int{401, 403, 404}, schema: "[]$API_Entities_Ci_Job",
		params: []string{"scope", "ref", "page", "per_page"}},
	"GET /api/v4/projects/{id}/jobs/{job_id}": {success: []int{200}, errors: []int{401, 403, 404}, schema: "$API_Entities_Ci_Job"},
	"POST /api/v4/projects/{id}/jobs/{job_id}/cancel": {success: []int{201}, errors: []int{401, 403, 404}, schema: "$API_Entities_Ci_Job",
		params: []string{"force"}},
	"POST /api/v4/projects/{id}/pipelines/{pipeline_id}/cancel": {success: []int{201}, errors: []int{401, 403, 404},
		schema: "$API_Entities_Ci_Pipeline"},
	"GET /api/v4/personal_access_tokens/self": {success: []int{200}, errors: []int{401, 404},
		schema: "$API_Entities_PersonalAccessTokenWithLastUsedIps"},

	// The runner API (lib/api/ci/runner.rb): status codes and parameters
	// only.
	"POST /api/v4/runners/verify": {success: []int{200}, errors: []int{403, 422}, params: []string{"token", "system_id"}},
	"DELETE /api/v4/runners":      {success: []int{204}, errors: []int{403}, params: []string{"token"}},
	"DELETE /api/v4/runners/managers": {success: []int{204}, errors: []int{400, 403, 404},
		params: []string{"token", "system_id"}},
	"POST /api/v4/jobs/request": {success: []int{201, 204}, errors: []int{403, 409, 422, 429},
		params: []string{"token", "system_id", "last_update", "info.name", "info.version", "info.revision", "info.platform",
			"info.architecture", "info.executor", "info.features", "info.config", "info.labels", "session.url",
			"session.certificate", "session.authorization"}},
	"PUT /api/v4/jobs/{id}": {success: []int{200, 202}, errors: []int{400, 403, 409, 429},
		params: []string{"token", "state", "checksum", "failure_reason", "output.checksum", "output.bytesize", "exit_code"}},
	"PATCH /api/v4/jobs/{id}/trace": {success: []int{202}, errors: []int{400, 403, 416, 429},
		params: []string{"token", "debug_trace"}},
}

// jsonTypeOf names a decoded JSON value's type in the description's words.
func jsonTypeOf(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case bool:
		return "boolean"
	case float64:
		if x == math.Trunc(x) {
			return "integer"
		}
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// TestDescriptionTable checks the transcription itself: every $ref names
// a transcribed entity, every absent property is one the entity documents
// (a misspelt name would excuse nothing), and every reason is given.
func TestDescriptionTable(t *testing.T) {
	refOK := func(where, typ string) {
		if typ == "" {
			return
		}
		if name, ok := strings.CutPrefix(strings.TrimPrefix(typ, "[]"), "$"); ok {
			if _, ok := descEntities[name]; !ok {
				t.Errorf("%s: $ref %s is not in descEntities; transcribe it", where, name)
			}
			return
		}
		if !slices.Contains([]string{"string", "integer", "number", "boolean", "array", "object"}, typ) {
			t.Errorf("%s: type %q is not one of the description's (string, integer, number, boolean, array, object, $Entity, []$Entity)", where, typ)
		}
	}
	documents := func(entityName, propName string) bool {
		return slices.ContainsFunc(descEntities[entityName].props, func(p prop) bool { return p.name == propName })
	}
	for name, e := range descEntities {
		seen := map[string]bool{}
		for _, p := range e.props {
			if seen[p.name] {
				t.Errorf("%s.%s: transcribed twice", name, p.name)
			}
			seen[p.name] = true
			refOK(name+"."+p.name, p.doc)
			refOK(name+"."+p.name+" (sent)", p.sent)
		}
		for k, why := range e.absent {
			if !seen[k] || strings.TrimSpace(why) == "" {
				t.Errorf("%s: absent %q is not a documented property or has no reason", name, k)
			}
		}
	}
	props := 0
	for _, e := range descEntities {
		props += len(e.props)
	}
	t.Logf("%d entities (with the inline objects) and %d properties transcribed, %d operations", len(descEntities), props, len(descEndpoints))
	for key, ep := range descEndpoints {
		refOK(key, ep.schema)
		refOK(key+" (sent)", ep.sent)
		if len(ep.success) == 0 {
			t.Errorf("%s: no documented success status", key)
		}
		for k, why := range ep.absent {
			i := strings.LastIndex(k, ".")
			if i < 0 || !documents(k[:i], k[i+1:]) || strings.TrimSpace(why) == "" {
				t.Errorf("%s: absent %q is not a documented Entity.property or has no reason", key, k)
			}
		}
	}
}

// descChecker calls the simulator and checks each answer against the
// table, counting what it checked.
type descChecker struct {
	t       *testing.T
	w       *world
	called  map[string]bool
	checked map[string]map[string]bool // endpoint -> "Entity.property" present and of a documented type
	absent  map[string]map[string]bool // endpoint -> "Entity.property" left out with a reason
}

// do sends method path (the endpoint's documented template filled in) and
// checks that the simulator answers want, that want is a status the
// description documents for it, that every parameter sent is documented,
// and, for a documented success entity, the answer's properties. It
// returns the decoded answer (nil without a body).
func (c *descChecker) do(key, path string, header http.Header, body any, want int) any {
	c.t.Helper()
	ep, ok := descEndpoints[key]
	if !ok {
		c.t.Fatalf("%s is not in descEndpoints", key)
	}
	c.called[key] = true
	if !slices.Contains(ep.success, want) && !slices.Contains(ep.errors, want) {
		c.t.Errorf("%s: this test expects %d, which the description does not document (success %v, errors %v)", key, want, ep.success, ep.errors)
	}
	u, err := url.Parse(path)
	if err != nil {
		c.t.Fatal(err)
	}
	sent := map[string]bool{}
	for k := range u.Query() {
		sent[strings.TrimSuffix(k, "[]")] = true
	}
	if m, ok := body.(map[string]any); ok {
		for k := range m {
			sent[k] = true
		}
	}
	for k := range sent {
		if !slices.Contains(ep.params, k) {
			c.t.Errorf("%s: the test sends parameter %q, which the description does not document (%v)", key, k, ep.params)
		}
	}
	status, _, raw := c.w.call(c.t, strings.Fields(key)[0], path, header, body)
	if status != want {
		c.t.Fatalf("%s %s: status %d, want %d: %s", key, path, status, want, raw)
	}
	if len(raw) == 0 || want >= 300 {
		return nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		if ep.schema != "" {
			c.t.Fatalf("%s: the answer is not JSON: %v: %s", key, err, raw)
		}
		return nil
	}
	if ep.schema != "" {
		typ := ep.schema
		if ep.sent != "" {
			typ = ep.sent
		}
		c.value(key, "answer", v, typ, false)
	}
	return v
}

// value checks one value against a type of the table.
func (c *descChecker) value(key, where string, v any, typ string, null bool) {
	c.t.Helper()
	got := jsonTypeOf(v)
	if got == "null" {
		if !null {
			c.t.Errorf("%s: %s is null; the description documents %s and GitLab sends a value (fix the simulator, or mark the property nullable in the table if GitLab sends null)", key, where, typ)
		}
		return
	}
	switch {
	case strings.HasPrefix(typ, "[]$"):
		arr, ok := v.([]any)
		if !ok {
			c.t.Errorf("%s: %s is %s, want an array of %s", key, where, got, typ[3:])
			return
		}
		for i, el := range arr {
			c.value(key, fmt.Sprintf("%s[%d]", where, i), el, typ[2:], false)
		}
	case strings.HasPrefix(typ, "$"):
		m, ok := v.(map[string]any)
		if !ok {
			c.t.Errorf("%s: %s is %s, want an object (%s)", key, where, got, typ[1:])
			return
		}
		c.entity(key, where, m, typ[1:])
	case typ == "number":
		if got != "number" && got != "integer" {
			c.t.Errorf("%s: %s is %s, the description documents number (fix its JSON type in the simulator)", key, where, got)
		}
	case got != typ:
		c.t.Errorf("%s: %s is %s, the description documents %s (fix its JSON type in the simulator)", key, where, got, typ)
	}
}

// entity checks an object against a documented entity: every documented
// property present (or absent with a reason), of the documented type, and
// nothing undocumented.
func (c *descChecker) entity(key, where string, m map[string]any, name string) {
	c.t.Helper()
	e := descEntities[name]
	documented := map[string]bool{}
	for _, p := range e.props {
		documented[p.name] = true
		id := name + "." + p.name
		v, ok := m[p.name]
		if !ok {
			why := e.absent[p.name]
			if why == "" {
				why = descEndpoints[key].absent[id]
			}
			if why == "" {
				c.t.Errorf("%s: %s lacks %q, which the description documents for %s (%s); add it to the simulator's answer, or list it as absent with the reason", key, where, p.name, name, p.doc)
			} else {
				c.absent[key][id] = true
			}
			continue
		}
		typ := p.doc
		if p.sent != "" {
			typ = p.sent
		}
		c.value(key, where+"."+p.name, v, typ, p.null)
		c.checked[key][id] = true
	}
	for k := range m {
		if !documented[k] {
			c.t.Errorf("%s: %s has %q, which the description does not document for %s; remove it from the simulator's answer", key, where, k, name)
		}
	}
}

// TestSimulatorAgainstGitLabDescription calls every documented endpoint the
// simulator serves, in a world where runners of each scope ran, finished
// and lost jobs, and checks each answer against the transcribed
// description.
func TestSimulatorAgainstGitLabDescription(t *testing.T) {
	w := newWorld(t)
	c := &descChecker{t: t, w: w, called: map[string]bool{}, checked: map[string]map[string]bool{}, absent: map[string]map[string]bool{}}
	for key := range descEndpoints {
		c.checked[key] = map[string]bool{}
		c.absent[key] = map[string]bool{}
	}
	tok := func(token string) http.Header { return http.Header{"Private-Token": {token}} }
	id := func(v any) int64 {
		t.Helper()
		m, _ := v.(map[string]any)
		n, ok := m["id"].(float64)
		if !ok {
			t.Fatalf("no id in %v", v)
		}
		return int64(n)
	}
	app := w.projectID(t, "acme/platform/app")
	platform := w.groupID(t, "acme/platform")
	appPath := "/api/v4/projects/" + strconv.FormatInt(app, 10)

	// Runners of each scope, with every attribute the simulator models.
	created := c.do("POST /api/v4/user/runners", "/api/v4/user/runners", tok(maintPAT), map[string]any{
		"runner_type": ProjectType, "project_id": app, "description": "vm-1", "tag_list": []string{"hyperfleet"},
		"run_untagged": false, "locked": true, "paused": false, "access_level": "not_protected", "maximum_timeout": 7200,
		"maintenance_note": "made by HyperFleet",
	}, 201)
	projRunner, projToken := id(created), created.(map[string]any)["token"].(string)
	grpRunner := id(c.do("POST /api/v4/user/runners", "/api/v4/user/runners", tok(groupToken),
		map[string]any{"runner_type": GroupType, "group_id": platform, "tag_list": []string{"hyperfleet"}}, 201))
	instCreated := c.do("POST /api/v4/user/runners", "/api/v4/user/runners", tok(adminPAT), map[string]any{"runner_type": InstanceType}, 201)
	instToken := instCreated.(map[string]any)["token"].(string)
	c.do("POST /api/v4/user/runners", "/api/v4/user/runners", tok(devPAT), map[string]any{"runner_type": ProjectType, "project_id": app}, 403)

	// The runner API: the runner verifies its token.
	c.do("POST /api/v4/runners/verify", "/api/v4/runners/verify", nil, glrVerifyRunnerRequest{Token: projToken, SystemID: "s_0123456789ab"}, 200)
	c.do("POST /api/v4/runners/verify", "/api/v4/runners/verify", nil, glrVerifyRunnerRequest{Token: "glrt-unknown", SystemID: "s_0123456789ab"}, 403)

	runnerPath := func(id int64) string { return "/api/v4/runners/" + strconv.FormatInt(id, 10) }
	c.do("GET /api/v4/runners/{id}", runnerPath(projRunner), tok(adminPAT), nil, 200)
	c.do("GET /api/v4/runners/{id}", runnerPath(grpRunner), tok(ownerPAT), nil, 200)
	c.do("GET /api/v4/runners/{id}", runnerPath(999999), tok(adminPAT), nil, 404)
	c.do("GET /api/v4/runners/{id}", runnerPath(grpRunner), tok(maintPAT), nil, 403)
	c.do("PUT /api/v4/runners/{id}", runnerPath(projRunner), tok(maintPAT), map[string]any{"description": "vm-1b", "paused": false}, 200)
	c.do("PUT /api/v4/runners/{id}", runnerPath(projRunner), tok(maintPAT), map[string]any{"access_level": "not_protected", "maximum_timeout": 3600}, 200)
	c.do("PUT /api/v4/runners/{id}", runnerPath(projRunner), tok(maintPAT), map[string]any{"maximum_timeout": 60}, 400)
	c.do("POST /api/v4/user/runners", "/api/v4/user/runners", tok(maintPAT), map[string]any{
		"runner_type": ProjectType, "project_id": app, "tag_list": []string{"hyperfleet"}, "maximum_timeout": 599}, 400)
	c.do("GET /api/v4/runners/all", "/api/v4/runners/all?type=project_type&per_page=50", tok(adminPAT), nil, 200)
	c.do("GET /api/v4/projects/{id}/runners", appPath+"/runners?tag_list=hyperfleet", tok(maintPAT), nil, 200)
	c.do("GET /api/v4/groups/{id}/runners", "/api/v4/groups/acme%2Fplatform/runners?status=never_contacted", tok(ownerPAT), nil, 200)

	// Projects and groups, read by a Maintainer (who sees the
	// administrators' fields) and a Developer.
	c.do("GET /api/v4/projects/{id}", appPath, tok(maintPAT), nil, 200)
	c.do("GET /api/v4/projects/{id}", "/api/v4/projects/acme%2Fplatform%2Fapp", tok(devPAT), nil, 200)
	c.do("GET /api/v4/groups/{id}", "/api/v4/groups/acme%2Fplatform", tok(ownerPAT), nil, 200)
	c.do("GET /api/v4/groups/{id}/projects", "/api/v4/groups/acme/projects?include_subgroups=true", tok(ownerPAT), nil, 200)

	// Jobs: one runs and fails, one is canceled while pending, one while
	// running (with its pipeline).
	if _, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/platform/app", Jobs: []JobConfig{{Name: "build", Script: []string{"make"}, Tags: []string{"hyperfleet"}}}}); err != nil {
		t.Fatal(err)
	}
	job := c.do("POST /api/v4/jobs/request", "/api/v4/jobs/request", nil, glrJobRequest{Token: projToken, SystemID: "s_0123456789ab"}, 201).(map[string]any)
	jobID, jobToken := int64(job["id"].(float64)), job["token"].(string)
	jobPath := "/api/v4/jobs/" + strconv.FormatInt(jobID, 10)
	trace := func(contentRange string, data string, want int) {
		t.Helper()
		h := http.Header{"Job-Token": {jobToken}, "Content-Type": {"text/plain"}}
		if contentRange != "" {
			h.Set("Content-Range", contentRange)
		}
		c.do("PATCH /api/v4/jobs/{id}/trace", jobPath+"/trace", h, []byte(data), want)
	}
	trace("0-5", "hello\n", 202)
	trace("2-5", "llo\n", 416)
	trace("", "x", 400)
	update := func(u glrUpdateJobRequest, want int) {
		t.Helper()
		c.do("PUT /api/v4/jobs/{id}", jobPath, nil, u, want)
	}
	update(glrUpdateJobRequest{Token: jobToken, State: "running"}, 200)
	update(glrUpdateJobRequest{Token: jobToken, State: "failed", FailureReason: "script_failure", ExitCode: 1, Output: glrJobTraceOutput{Bytesize: 99}}, 202)
	update(glrUpdateJobRequest{Token: jobToken, State: "failed", FailureReason: "script_failure", ExitCode: 1, Output: glrJobTraceOutput{Bytesize: 6}}, 200)
	update(glrUpdateJobRequest{Token: "glcbt-wrong", State: "running"}, 403)
	c.do("POST /api/v4/jobs/request", "/api/v4/jobs/request", nil, glrJobRequest{Token: projToken}, 204)
	c.do("POST /api/v4/jobs/request", "/api/v4/jobs/request", nil, glrJobRequest{Token: "glrt-unknown"}, 403)

	pl, err := w.sim.CreatePipeline(PipelineRequest{Project: "acme/platform/app", Jobs: []JobConfig{
		{Name: "unit", Script: []string{"true"}, Tags: []string{"hyperfleet"}},
		{Name: "lint", Script: []string{"true"}, Tags: []string{"hyperfleet"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	c.do("POST /api/v4/jobs/request", "/api/v4/jobs/request", nil, glrJobRequest{Token: projToken}, 201)
	jobsPath := appPath + "/jobs/"
	c.do("GET /api/v4/projects/{id}/jobs", appPath+"/jobs?scope[]=running&scope[]=pending&scope[]=failed", tok(maintPAT), nil, 200)
	c.do("GET /api/v4/projects/{id}/jobs/{job_id}", jobsPath+strconv.FormatInt(jobID, 10), tok(devPAT), nil, 200)
	c.do("GET /api/v4/projects/{id}/jobs/{job_id}", jobsPath+"999999", tok(devPAT), nil, 404)
	c.do("POST /api/v4/projects/{id}/jobs/{job_id}/cancel", jobsPath+strconv.FormatInt(pl.Jobs[1], 10)+"/cancel", tok(devPAT), nil, 201)
	c.do("POST /api/v4/projects/{id}/pipelines/{pipeline_id}/cancel", appPath+"/pipelines/"+strconv.FormatInt(pl.ID, 10)+"/cancel", tok(devPAT), nil, 201)
	c.do("GET /api/v4/projects/{id}/jobs", appPath+"/jobs", tok(maintPAT), nil, 200)

	c.do("GET /api/v4/personal_access_tokens/self", "/api/v4/personal_access_tokens/self", tok(projectToken), nil, 200)
	c.do("GET /api/v4/personal_access_tokens/self", "/api/v4/personal_access_tokens/self", tok("glpat-unknown"), nil, 401)

	// The runner goes: its manager (the parameters in the query string, as
	// the description gives them), then the runner itself.
	c.do("DELETE /api/v4/runners/managers", "/api/v4/runners/managers?token="+projToken+"&system_id=s_unknown", nil, nil, 404)
	c.do("DELETE /api/v4/runners/managers", "/api/v4/runners/managers?token="+projToken+"&system_id=s_0123456789ab", nil, nil, 204)
	c.do("DELETE /api/v4/runners", "/api/v4/runners?token="+instToken, nil, nil, 204)
	c.do("DELETE /api/v4/runners", "/api/v4/runners?token="+instToken, nil, nil, 403)
	c.do("DELETE /api/v4/runners/{id}", runnerPath(grpRunner), tok(adminPAT), nil, 204)

	// What the runner API reads from its requests is documented.
	documented := map[string]bool{}
	for key, ep := range descEndpoints {
		if strings.Contains(key, "/jobs/") || strings.HasSuffix(key, "/api/v4/runners") || strings.Contains(key, "/runners/verify") || strings.Contains(key, "/runners/managers") {
			for _, p := range ep.params {
				documented[p] = true
			}
		}
	}
	for _, name := range jsonNames(reflect.TypeFor[runnerRequest](), "") {
		if !documented[name] {
			t.Errorf("the simulator's runner API reads %q (runnerRequest), which no runner API operation of the description documents", name)
		}
	}

	var keys []string
	for key := range descEndpoints {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	total, absent := map[string]bool{}, map[string]bool{}
	for _, key := range keys {
		if !c.called[key] {
			t.Errorf("%s is in the table but this test never calls it", key)
		}
		for name := range c.checked[key] {
			total[name] = true
		}
		for name := range c.absent[key] {
			absent[name] = true
		}
		t.Logf("%-62s %3d properties checked, %2d absent with a reason", key, len(c.checked[key]), len(c.absent[key]))
	}
	t.Logf("%d endpoints, %d distinct entity properties checked, %d absent with a reason (description %s at %s)", len(keys), len(total), len(absent), descriptionPath, descriptionCommit[:12])
}

// jsonNames lists a struct type's JSON field names, nested structs' as
// "outer.inner".
func jsonNames(typ reflect.Type, prefix string) []string {
	var out []string
	for i := range typ.NumField() {
		fld := typ.Field(i)
		name, _, _ := strings.Cut(fld.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		if fld.Type.Kind() == reflect.Struct {
			out = append(out, jsonNames(fld.Type, prefix+name+".")...)
			continue
		}
		out = append(out, prefix+name)
	}
	return out
}
