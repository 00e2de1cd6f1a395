"""The one-off studies beside the sweeps, one module each, run by `python -m experiments.studies NAME`:

  bench          the engine against DyNet, TensorFlow, PyTorch by level, and the GEMM floor
  nary           the child-sum Tree-LSTM on n-ary trees against DyNet; 32 child slots against 4
  task_cost      where a Tree-LSTM epoch's time goes per loop task
  targets        the speed targets against the floor and bound of bench's and nary's run
  startup        a new process's first training step against a steady-state one
  policies       the batching policies: their tasks and their training time
  extrapolation  the cpu profile's extrapolated epochs against long measurements
  ray_walltime   one sweep's wall time with the local executor and on a local Ray cluster
  sst            SST sentiment trained to accuracy on Cavs, DyNet and PyTorch
  torch_module   the engine's training step against the same step through cavs.torch (a torch head)

Each is `main(results_dir, args)` with its options declared by `add_arguments(parser)`; one that
measures in processes of its own has `cell(spec) -> dict`, which the dispatcher runs for
`--cell JSON` (launch.run starts those). They stand on the harness (launch, floors, environment,
runner...) and never import each other.
"""
