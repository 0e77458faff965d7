#!/bin/sh
# A verifier that never reads: closes its stdin and lingers briefly, so the
# host's write hits a closed pipe (EPIPE, which must not raise SIGPIPE there).
exec 0<&-
sleep 0.2
