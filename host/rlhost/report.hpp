// `rlhost report RUN_DIR [--out FILE]`: one self-contained HTML page of a run
// folder (docs/observability.md): a chart per metric and phase, the
// evaluation results, and a table of sampled rollouts by step. No script, no
// network; it works on a run that is still going.
#pragma once

#include <string>
#include <vector>

namespace rlhost {

int cmd_report(const std::vector<std::string> &args);

} // namespace rlhost
