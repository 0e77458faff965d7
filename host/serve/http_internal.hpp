// host/serve/http_internal.hpp: private to rl_serve's HTTP layer (http.cpp, http_server.cpp,
// http_client.cpp): Boost.Beast's names and the helpers the server and the client share.
//
// Every socket operation is an asynchronous Beast operation run to completion
// on a private io_context of the calling thread: that is how a blocking,
// thread-per-connection server gets Beast's timeouts (basic_stream closes the
// socket when an operation outlives its expiry), which plain synchronous Asio
// calls do not have.
#pragma once

#include "http.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace rl::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using beast::error_code;

namespace http_detail {

std::string lower(std::string_view s);

// Beast's string_view (boost::string_view in Boost 1.74) from / to the standard one.
beast::string_view bsv(std::string_view s);
std::string_view ssv(beast::string_view s);

std::chrono::steady_clock::duration seconds(double s);

// Runs one asynchronous operation on `ioc` to completion and returns its error.
template <class Start>
error_code run_op(net::io_context &ioc, Start &&start) {
    error_code result = net::error::would_block;
    start([&result](error_code ec, std::size_t) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
}

} // namespace http_detail

} // namespace rl::serve
