// librl's own translation unit: the C API lives in rl_host_impl (capi.cpp),
// pulled in whole. This file only anchors the shared library.
#include <rl_api.h>
