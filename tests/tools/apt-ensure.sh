#!/bin/sh
# apt-ensure.sh COMMAND WHAT PACKAGE...: install PACKAGEs with apt when COMMAND is missing and
# apt can (root, Debian/Ubuntu), for the tests that need WHAT; otherwise say those tests skip.
command=$1 what=$2
shift 2
command -v "$command" >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    if apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 \
       || { apt-get update -q >/dev/null 2>&1 \
            && apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1; }; then
        echo "installed $* (apt) for the $what tests"
        exit 0
    fi
fi
echo "no $command, and apt cannot install it here: the $what tests will skip"
