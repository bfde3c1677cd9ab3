"""The simulator (:mod:`.simulator`) and what it runs: workloads drawn or read from
traces (:mod:`.workload`, :mod:`.swf`), comparisons of policies (:mod:`.compare`) and
the offline list scheduler of evolving jobs (:mod:`.listsched`)."""
