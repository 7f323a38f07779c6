// TODO(issue A): placeholder until this command lands.
#include "common/logging.h"
#include "tools/commands.h"

namespace herd::tools {

int RunVersion(int, char**) { return ReportError(Status::Internal("herd version: not implemented yet")); }

}  // namespace herd::tools
