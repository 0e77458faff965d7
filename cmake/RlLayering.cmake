# The dependency rule of DESIGN.md, checked when the build is configured:
# abi/ depends on nothing, sdk/ and plugins on abi/ only, the engine does not
# depend on the trainer (both sit on the model core), core/ never on host/ or
# scripting/, and scripting/ only on librl's C API. A link that breaks the rule
# stops the configure step naming both targets.
include_guard(GLOBAL)

function(rl_forbid_links target)
  if(NOT TARGET ${target})
    return()
  endif()
  get_target_property(links ${target} LINK_LIBRARIES)
  if(NOT links)
    return()
  endif()
  foreach(forbidden ${ARGN})
    foreach(link ${links})
      if(link STREQUAL forbidden OR link MATCHES "^\\$<LINK_LIBRARY:[A-Z_]+,${forbidden}>$")
        message(FATAL_ERROR "layering: ${target} links ${forbidden}, which the dependency rule "
                            "forbids (see DESIGN.md and cmake/RlLayering.cmake)")
      endif()
    endforeach()
  endforeach()
endfunction()

function(rl_check_layering)
  rl_forbid_links(rl_base rl_core rl_trainer rl_engine rl_buffer rl_host_impl rl_host_train)
  rl_forbid_links(rl_core rl_trainer rl_engine rl_buffer rl_host_impl rl_host_train rl_lua)
  rl_forbid_links(rl_engine rl_trainer rl_host_impl rl_host_train rl_lua)
  rl_forbid_links(rl_trainer rl_engine rl_host_impl rl_host_train rl_lua)
  rl_forbid_links(rl_buffer rl_core rl_trainer rl_engine rl_host_impl rl_host_train rl_lua)
  rl_forbid_links(rl_lua rl_core rl_trainer rl_engine rl_buffer rl_host_impl rl_host_train)
  rl_forbid_links(rl_serve rl_trainer rl_buffer rl_host_impl rl_host_train rl_lua)
  rl_forbid_links(rl_training_server rl_buffer rl_host_impl rl_host_train rl_lua)
  get_property(plugins GLOBAL PROPERTY RL_PLUGIN_TARGETS)
  foreach(p ${plugins})
    rl_forbid_links(${p} rl_core rl_trainer rl_engine rl_buffer rl_base rl_runtime rl_lua)
  endforeach()
endfunction()
