"""The GPU side of the device-resident forward (numba-cuda): one-launch kernels for the small ops of a step
(`fused`), the driver that captures a decode step as a CUDA graph and replays it (`graph_step.GraphDecoder`),
the sim device's stand-ins for those kernels (`standin`), random-packed model files for GPU benchmarks
(`randmodel`) and the PTX compile check (`ptx`).

The model math is the concept modules' own: `Runtime(backend="cuda")` runs them on device arrays
(refengine.devarray), every arch alike, with weight multiplies and expert dispatch on `quant.cuda`'s kernels.
"""
