"""One torch thread per notebook kernel, for strict nbval (`make nbval` sets IPYTHONDIR to
.ci/ipython, so IPython runs this file first in every kernel it starts).

nbval runs two notebooks at once on our 2-core machines. Each notebook calls
`torch.set_num_threads(2)` (its timings are measured with two threads), so two kernels
ran four compute threads on two cores, and PyTorch's OpenMP threads spent much of their
time waiting for each other: measured in docs/benchmarks.md ("CI time plan"), two
one-thread kernels were about 3x faster than two two-thread kernels. Timing outputs are
not compared by nbval, so the thread count changes no checked output.

The limit is $MINILLM_KERNEL_THREADS (unset: no limit, the notebook decides).
"""

import os

if os.environ.get("MINILLM_KERNEL_THREADS"):
    import torch

    _limit = int(os.environ["MINILLM_KERNEL_THREADS"])
    _set_num_threads = torch.set_num_threads
    _set_num_threads(_limit)
    torch.set_num_threads = lambda n: _set_num_threads(min(int(n), _limit))
