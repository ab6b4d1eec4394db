# Sourced by the scripts that build a tool into a cache directory
# (hack/helm, hack/spire, hack/external-dns, hack/release build.sh).
#
# build_lock DIR takes DIR's build lock, one build at a time per directory:
# a second caller (CI starts some builds in the background, then a step
# needs the tool) waits for the first and then finds what it built. The
# lock is held until the script exits.
build_lock() {
	exec 9>"$1/.lock"
	if ! flock -n 9; then
		echo "$(basename "$(dirname "$0")")/$(basename "$0"): waiting for the build already running into $1" >&2
		flock 9
	fi
}
