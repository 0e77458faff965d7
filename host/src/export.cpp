// librl's own translation unit: the C API lives in rl_host_impl and rl_host_train (capi/),
// pulled in whole. This file only anchors the shared library.
#include <rl_api.h>
