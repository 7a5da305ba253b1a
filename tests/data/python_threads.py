# Two CPU-bound threads of pure Python (the held-out suite's kind of
# program), each counting to argv[1] without a system call and noting how
# far the other had come when it ended; prints what the first to end saw.
# CPython hands its lock over only when a waiting thread, woken by a tick,
# asks for it: where the kernel preempts user code they interleave (the
# first to end saw the other part-way), where it does not they run one
# after the other (it saw 0). Both start counting at a barrier, so that
# what the first saw depends on preemption alone, not on how long the
# second took to start (slow where the guest kernel is emulated, PVM:
# once, under `provm run` there, the first saw 0, which a late start
# explains as well as a missing preemption; now only the latter can).
import sys
import threading

goal = int(sys.argv[1])
count = [0, 0]
done = []
both_started = threading.Barrier(2)


def work(me):
    both_started.wait()
    for i in range(1, goal + 1):
        count[me] = i
    done.append(count[1 - me])


threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("the first to end saw the other at", done[0])
