#!/bin/sh
# A verifier that hangs: reads one request, then waits on a child `sleep`
# forever. Writes its own pid and the sleep's pid to the file named by $1 so
# the test can check that both are killed (the whole process group).
read -r line
sleep 3600 &
echo "$$ $!" > "$1"
wait
