"""Names the tables, the SQL, the report and the CLI share, each defined once. The SQL statements read
them as parameters ($cluster_idle, $unattributed), never as literals."""

CLUSTER_IDLE = "(cluster idle)"  # the experiment of GPU time no pod held: the cost nobody was charged
UNATTRIBUTED = "unattributed"  # the experiment of a held GPU whose pod has no experiment label or namespace
OTHER_EXPERIMENTS = "(other experiments)"  # a chart's bucket for the experiments that do not fit

# The cost model (docs/cost-model.md): bill lines on no node-hour and without an Experiment tag (the file system, EKS, S3) are shared
# by the GPU-hours each experiment held that day. The one policy there is; a second would be named here.
SHARED_COST_POLICY = "shared by the GPU-hours each experiment held that day"

# The bill's effective $/h per instance type (Savings Plans, RIs, spot), pushed by spend_now; the live cost
# rules price a node with it where present, else with the price table's on-demand price
EFFECTIVE_PRICE_METRIC = "foxhunt_effective_price_usd_per_hour"

SQL_PARAMETERS = {"cluster_idle": CLUSTER_IDLE, "unattributed": UNATTRIBUTED}
