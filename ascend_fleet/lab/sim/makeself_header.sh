#!/bin/sh
# Self-extracting package in makeself's layout: this shell header, then a gzip'd tar payload.
# Built by the ascend-fleet lab (ascend_fleet/lab/sim/vendor.py) to stand in for @LABEL@.
label="@LABEL@"
header_lines=@HEADER_LINES@
payload_sha256="@PAYLOAD_SHA256@"

payload() { tail -n +"$((header_lines + 1))" "$0"; }
intact() { [ "$(payload | sha256sum | cut -d' ' -f1)" = "$payload_sha256" ]; }
quiet=no
for arg in "$@"; do
    case "$arg" in
        --check)
            printf 'Verifying archive integrity...'
            if intact; then echo ' 100%   SHA256 checksums are OK. All good.'; exit 0; fi
            echo ' Error in SHA256 checksums: the package is corrupt or truncated.'; exit 1 ;;
        --quiet) quiet=yes ;;
    esac
done
if ! intact; then
    echo "Error in SHA256 checksums: $0 is corrupt or truncated; download it again" >&2
    exit 1
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "$label: python3 is required to install this package" >&2
    exit 1
fi
workdir=$(mktemp -d "${TMPDIR:-/tmp}/selfgz.XXXXXX") || exit 1
trap 'rm -rf "$workdir"' EXIT
[ "$quiet" = yes ] || echo "Uncompressing $label  100%"
payload | gzip -dc | tar -xf - -C "$workdir" || { echo "$label: cannot extract the payload" >&2; exit 1; }
python3 "$workdir/ascend_sim_install.py" "$@"
exit $?
