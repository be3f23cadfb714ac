"""What a run tells people: metrics and progress, profiles, precision, the files `zerofit doctor`
reads and its diagnosis, and the filters that keep third-party noise out of a run's output."""
