// TODO(issue A): placeholder until this command lands.
#include "common/logging.h"
#include "tools/commands.h"

namespace herd::tools {

int RunPrepare(int, char**) { return ReportError(Status::Internal("herd prepare: not implemented yet")); }

}  // namespace herd::tools
