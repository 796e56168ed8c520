#!/usr/bin/env python3
"""What each failure of a kill-loop run cost, measured inside that run (bench/kill_loop.sh).

Usage: failure_cost.py STEPS KILLS [pre_s=0.5] [window_s=0.8]

STEPS: the run's DTRAIN_STEP_TIMES file ("<pid> <global step> <unix time>" per step and
process); KILLS: "<pid> <unix time>" per SIGKILL. The job's progress is the frontier: the highest
step any process has reached by a time. For each kill at t: r = the frontier's steps per second
over [t - pre_s, t]; the failure's cost = the time the frontier took to get window_s * r steps
past its step at t, minus window_s. The recovery, the steps rolled back and done again, and the
slow steps after it are in that cost; a machine that is slower for the whole run is not (its
rate is in r), which is what makes the figure steadier than a wall time against another run.
A kill whose window does not end before the next kill (a recovery longer than the period), or
that comes less than pre_s after the first step, is left out and counted.

Prints "<kills measured> <median s> <mean s> <kills left out>".
"""
import bisect
import statistics
import sys


def main():
    steps_path, kills_path = sys.argv[1], sys.argv[2]
    pre = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5
    window = float(sys.argv[4]) if len(sys.argv) > 4 else 0.8
    events = []
    with open(steps_path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3:
                events.append((float(parts[2]), int(parts[1])))
    kills = []
    with open(kills_path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2:
                kills.append(float(parts[1]))
    kills.sort()
    events.sort()
    if not events or not kills:
        print(0, "-", "-", len(kills))
        return
    times, frontier, top = [], [], -1
    for t, s in events:
        top = max(top, s)
        times.append(t)
        frontier.append(top)

    def at(t):  # the frontier at time t
        i = bisect.bisect_right(times, t) - 1
        return frontier[i] if i >= 0 else None

    costs, left_out = [], 0
    for i, k in enumerate(kills):
        before, start = at(k - pre), at(k)
        if before is None or start is None or start <= before:
            left_out += 1
            continue
        target = start + window * (start - before) / pre
        j = bisect.bisect_left(frontier, target)
        end = kills[i + 1] if i + 1 < len(kills) else float("inf")
        if j == len(frontier) or times[j] >= end:
            left_out += 1
            continue
        costs.append(times[j] - k - window)
    if costs:
        print(len(costs), f"{statistics.median(costs):.3f}", f"{statistics.mean(costs):.3f}",
              left_out)
    else:
        print(0, "-", "-", left_out)


if __name__ == "__main__":
    main()
