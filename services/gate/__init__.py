"""The admission gate: a team's job commands enter the command stream only within their share's
limits (`limits.Gate`, pure; `service.AdmissionGate`, on the bus).  `quotasched gate` runs one;
`quotasched up` runs one beside its scheduler."""
