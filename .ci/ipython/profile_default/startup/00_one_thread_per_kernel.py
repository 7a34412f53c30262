"""One torch thread per notebook kernel, for strict nbval (`make nbval` sets IPYTHONDIR to
.ci/ipython, so IPython runs this file first in every kernel it starts).

nbval runs two notebooks at once on our 2-core machines. Each notebook calls
`torch.set_num_threads(2)` (its timings are measured with two threads), so two kernels
ran four compute threads on two cores, and PyTorch's OpenMP threads spent much of their
time waiting for each other: on our shared 2-core machine two one-thread kernels were
about 3x faster than two two-thread kernels (docs/benchmarks.md, "CI time plan").
Timings are not compared (nbval-ignore-output), but any other checked output must not
depend on the number of threads, e.g. a float printed to its last bits.

The limit is $MINILLM_KERNEL_THREADS (unset: no limit, the notebook decides).
"""

import os

if os.environ.get("MINILLM_KERNEL_THREADS"):
    import torch

    _limit = int(os.environ["MINILLM_KERNEL_THREADS"])
    _set_num_threads = torch.set_num_threads
    _set_num_threads(_limit)
    torch.set_num_threads = lambda n: _set_num_threads(min(int(n), _limit))
