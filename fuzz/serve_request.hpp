// fuzz/serve_request.hpp: the input as the body of a POST request to a route
// of the servers, for the targets that read it as the routes do (json_body).
#pragma once

#include "fuzz_target.hpp"

#include "serve/http.hpp"

inline rl::serve::Request post_request(const char *path, const uint8_t *data, size_t size) {
    rl::serve::Request req;
    req.method = "POST";
    req.path = path;
    req.body = fuzz_text(data, size);
    return req;
}
