// TODO(issue A): placeholder until this command lands.
#include "common/logging.h"
#include "tools/commands.h"

namespace herd::tools {

int RunLaunch(int, char**) { return ReportError(Status::Internal("herd launch: not implemented yet")); }

}  // namespace herd::tools
