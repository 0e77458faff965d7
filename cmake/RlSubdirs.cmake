# rl_add_subdirectories(<pattern>): add_subdirectory() for every folder under the
# current source folder whose CMakeLists.txt matches <pattern> (e.g. "*/*"), in
# sorted order, except folders listed in RL_SKIP (paths relative to the repo
# root; a developer option for building while a folder is being written).
include_guard(GLOBAL)
set(RL_SKIP "" CACHE STRING "Folders (relative to the repo root) to leave out of the build")

function(rl_add_subdirectories pattern)
  file(GLOB lists RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/${pattern}/CMakeLists.txt)
  list(SORT lists)
  foreach(list_file ${lists})
    get_filename_component(dir ${list_file} DIRECTORY)
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/${dir})
    if(rel IN_LIST RL_SKIP)
      message(STATUS "RL_SKIP: leaving out ${rel}")
      continue()
    endif()
    add_subdirectory(${dir})
  endforeach()
endfunction()
