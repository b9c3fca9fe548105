#!/usr/bin/env sh
# The real components some tests run, from the system's package manager, installed only when
# missing: Prometheus and promtool (the Prometheus bridge and the alert-rule tests) and Chromium
# with its WebDriver (the dashboard's browser tests). Those tests fail, never skip, without them.
set -eu
need=""
command -v prometheus >/dev/null 2>&1 || need="$need prometheus"
command -v promtool >/dev/null 2>&1 || case "$need" in *prometheus*) ;; *) need="$need prometheus" ;; esac
command -v chromium >/dev/null 2>&1 || need="$need chromium"
command -v chromedriver >/dev/null 2>&1 || need="$need chromium-driver"
[ -z "$need" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: install these with your package manager:$need" >&2
    exit 1
fi
as_root=""
[ "$(id -u)" -eq 0 ] || as_root="sudo"
echo "system-deps: installing$need" >&2
$as_root apt-get update -q >/dev/null 2>&1 || true
# shellcheck disable=SC2086  # word splitting of the package list is intended
DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -q --no-install-recommends $need >/dev/null
