"""rl_otel's test suite (a regular package: verl's wheel installs a top-level `tests` package that would shadow a
namespace one)."""
