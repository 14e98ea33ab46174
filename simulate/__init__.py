"""The main job (`python -m simulate`): every op at model shapes through the simulator,
checked against the float64 references and timed by the cost model; report in reports/."""
