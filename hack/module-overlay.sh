# Sourced by the scripts that build a tool from a copy of its Go module
# with some of its files replaced by ours (hack/external-dns, hack/spire
# build.sh): the replacements live in the script's _overlay/ directory at
# the path they replace, named .go.in so that no Go command of this
# repository reads or vets them.
#
# overlay_hash OVERLAY prints a 12-character hash of OVERLAY's .go.in files
# (in path order), for the cache key: another overlay is another build.
overlay_hash() {
	(cd "$1" && find . -name '*.go.in' | LC_ALL=C sort | xargs cat) | sha256sum | cut -c1-12
}

# overlay_module MODULE@VERSION OVERLAY DEST copies the module as go mod
# download unpacked it to DEST (the module cache is read-only, and go
# build's -overlay may not replace files beneath it) and puts each
# OVERLAY/<path>.go.in there as DEST/<path>.go. It fails, naming the file,
# when the module has no file at a replacement's path: the overlay was
# written for another version.
overlay_module() {
	local module=$1 overlay=$2 dest=$3 src f
	local files=()
	src=$(go mod download -json "$module" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	while IFS= read -r f; do files+=("${f#./}"); done < <(cd "$overlay" && find . -name '*.go.in' | LC_ALL=C sort)
	for f in "${files[@]}"; do
		if [[ ! -f "$src/${f%.in}" ]]; then
			echo "$(basename "$(dirname "$0")")/$(basename "$0"): $module has no ${f%.in} at '$src'; the replacement in $overlay needs it" >&2
			return 1
		fi
	done
	cp -R "$src" "$dest"
	chmod -R u+w "$dest"
	for f in "${files[@]}"; do cp "$overlay/$f" "$dest/${f%.in}"; done
}
