"""One-off probes behind findings in docs/performance.md, run from the repository root as
`python -m experiments.NAME`; experiments/README.md lists them."""
